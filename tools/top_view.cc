#include "top_view.h"

#include <algorithm>
#include <cstdio>

#include "cli_util.h"

namespace tensorhub::cli {
namespace {

// A worker as the view names it: its name and, to tell apart workers that
// share one (every `tensorhub fetch` is "tensorhub-fetch" by default), its id.
std::string Who(const std::string& name, const WorkerId& id) {
  if (name.empty()) return id.value();
  return name + "(" + id.value() + ")";
}

std::string VersionName(const std::string& model, Version v) {
  return model + "@" + std::to_string(v.value());
}

std::string Printf(const char* fmt, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof(buf), fmt, args...);
  return buf;
}

// Printable ASCII only, at most `width` columns.
std::string Fit(const std::string& line, size_t width) {
  std::string out;
  out.reserve(std::min(line.size(), width));
  for (char c : line) {
    out.push_back(c >= 0x20 && c < 0x7f ? c : '?');
  }
  if (out.size() > width) {
    out.resize(width);
    out.back() = '>';
  }
  return out;
}

void Versions(const HubSnapshot& s, std::vector<std::string>& out) {
  out.push_back(Printf("%-28s %-11s %10s  %-8s %s", "VERSION", "STATE", "SIZE",
                       "RETAINED", "HOLDERS (* filling)"));
  if (s.models.empty()) out.push_back("  no models");
  for (const SnapshotModel& m : s.models) {
    for (const SnapshotVersion& v : m.versions) {
      std::string holders = std::to_string(v.holders_complete) + " complete, " +
                            std::to_string(v.holders_filling) + " filling";
      const uint32_t all = v.holders_complete + v.holders_filling;
      for (size_t i = 0; i < v.holders.size(); ++i) {
        holders += (i == 0 ? ": " : ", ") +
                   Who(v.holders[i].name, v.holders[i].worker) +
                   (v.holders[i].filling ? "*" : "");
      }
      if (all > v.holders.size()) {
        holders += ", +" + std::to_string(all - v.holders.size()) + " more";
      }
      out.push_back(Printf("%-28s %-11s %10s  %-8s %s",
                           VersionName(m.model, v.version).c_str(),
                           std::string(VersionStateName(v.state)).c_str(),
                           FormatBytes(v.total_bytes).c_str(),
                           v.retained ? "yes" : "-", holders.c_str()));
    }
    if (m.versions_total > m.versions.size()) {
      out.push_back(
          Printf("  %s: %u older version(s) not shown", m.model.c_str(),
                 m.versions_total - static_cast<uint32_t>(m.versions.size())));
    }
  }
  if (s.models_total > s.models.size()) {
    out.push_back(
        Printf("  %u more model(s) not shown",
               s.models_total - static_cast<uint32_t>(s.models.size())));
  }
}

void Transfers(const HubSnapshot& s, std::vector<std::string>& out) {
  out.push_back(Printf("FETCHES IN FLIGHT (%u)", s.transfers_total));
  out.push_back(Printf("%-24s %-16s %-28s %12s  %s", "READER", "VERSION",
                       "DONE", "RATE", "SOURCES (bytes, rate)"));
  if (s.transfers.empty()) out.push_back("  none");
  for (const SnapshotTransfer& t : s.transfers) {
    std::string done;
    if (t.reported) {
      const double pct = t.bytes_total > 0
                             ? 100.0 * static_cast<double>(t.bytes_done) /
                                   static_cast<double>(t.bytes_total)
                             : 0.0;
      done = FormatBytes(t.bytes_done) + " / " + FormatBytes(t.bytes_total) +
             Printf(" %3.0f%%", pct);
    } else {
      done = "? / " + FormatBytes(t.bytes_total);
    }
    std::string sources;
    for (size_t i = 0; i < t.sources.size(); ++i) {
      const SnapshotSource& src = t.sources[i];
      sources += (i == 0 ? "" : ", ") + Who(src.name, src.worker);
      if (t.reported) {
        sources += " " + FormatBytes(src.bytes) + " " +
                   FormatRate(src.bytes_per_second);
      }
    }
    if (sources.empty()) sources = "-";
    out.push_back(Printf(
        "%-24s %-16s %-28s %12s  %s", Who(t.reader_name, t.reader).c_str(),
        VersionName(t.model, t.version).c_str(), done.c_str(),
        t.reported ? FormatRate(t.bytes_per_second).c_str() : "-",
        sources.c_str()));
  }
  if (s.transfers_total > s.transfers.size()) {
    out.push_back(
        Printf("  %u more not shown",
               s.transfers_total - static_cast<uint32_t>(s.transfers.size())));
  }
}

void Slowest(const HubSnapshot& s, std::vector<std::string>& out) {
  out.push_back("SLOWEST HOLDERS (as their readers measured them lately)");
  out.push_back(Printf("%-24s %12s  %s", "HOLDER", "RATE", "FETCHES"));
  if (s.slowest.empty()) out.push_back("  no finished fetch measured yet");
  for (const SnapshotHolderRate& r : s.slowest) {
    out.push_back(Printf("%-24s %12s  %u", Who(r.name, r.worker).c_str(),
                         FormatRate(r.bytes_per_second).c_str(), r.samples));
  }
}

}  // namespace

std::vector<std::string> RenderTop(const HubSnapshot& s,
                                   const std::string& title, size_t width,
                                   size_t max_lines) {
  width = std::max<size_t>(width, 20);
  std::vector<std::string> lines;
  lines.push_back(title);
  lines.push_back(Printf("workers %u  models %u  fetches in flight %u",
                         s.workers, s.models_total, s.transfers_total));
  lines.emplace_back();
  Versions(s, lines);
  lines.emplace_back();
  Transfers(s, lines);
  lines.emplace_back();
  Slowest(s, lines);
  if (max_lines > 0 && lines.size() > max_lines) {
    const size_t keep = std::max<size_t>(max_lines, 1) - 1;
    const size_t cut = lines.size() - keep;
    lines.resize(keep);
    lines.push_back(
        Printf("... %zu more line(s); a larger window shows them", cut));
  }
  for (std::string& l : lines) l = Fit(l, width);
  return lines;
}

}  // namespace tensorhub::cli
