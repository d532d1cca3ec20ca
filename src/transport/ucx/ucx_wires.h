// Which of UCX's wires the UCX transport may use by default (docs/security.md,
// "What a UCX peer can reach"; issue 27, item 5).
//
// UCX 1.13 emulates a get where no hardware reads remote memory (its tcp and
// shared-memory wires): the holder's worker answers a get message by copying
// from whatever address it names, with no check against a registration (and
// a put message by writing wherever it names), so a peer that may send them
// can read and write any memory of the holder's process. UCX offers no hook to
// check those gets. Over RDMA (rc, dc), a get is the NIC's read, which the NIC
// checks against the registration its remote key names (as long as the peer
// runs an unmodified UCX: docs/security.md, "What is left on RDMA"). So by
// default the
// transport runs only where every wire of its UCX context is one of those (or a
// wire that only carries UCX's connection set-up, or this process's own
// loopback); the opt-in (TENSORHUB_UCX_EMULATED_GETS=allow,
// ClientOptions::ucx_emulated_gets) keeps every wire, for networks whose every
// host is trusted.
//
// Pure: no UCX calls, so that it builds, and is tested, without TH_UCX.
#ifndef TENSORHUB_TRANSPORT_UCX_UCX_WIRES_H_
#define TENSORHUB_TRANSPORT_UCX_UCX_WIRES_H_

#include <string>
#include <string_view>
#include <vector>

#include "tensorhub/status.h"

namespace tensorhub::transport::ucx {

// The environment variable of the opt-in: "allow" uses wires whose gets
// UCX emulates; unset, empty or "refuse" does not.
inline constexpr char kEmulatedGetsEnv[] = "TENSORHUB_UCX_EMULATED_GETS";

// The wires a context is limited to by default where UCX_TLS is unset (or
// "all"): UCX's names for RDMA over InfiniBand/RoCE (rc: rc_verbs and rc_mlx5,
// with ud only for the connection set-up; dc: dc_mlx5).
inline constexpr char kRdmaWires[] = "rc,dc";

// One transport resource of a UCX context ("tcp" on device "lo").
struct Wire {
  std::string transport;
  std::string device;
  // Auxiliary: UCX uses it only to set up connections of another wire (ud
  // beside rc), never for a lane that moves data or answers gets.
  bool aux = false;
};

// The wires of a UCX context, from ucp_context_print_info's text, one line
// per resource ("#      resource 1  :  md 1  dev 1  flags -- tcp/lo"; the
// first flag is 'a' for an auxiliary wire). Other lines are ignored.
std::vector<Wire> ParseContextWires(std::string_view info);

// Whether every get over `w` is checked against the registration its key
// names by something other than the holder's CPU: rc_verbs, rc_mlx5 and
// dc_mlx5 (the NIC's RDMA read), an auxiliary wire (carries no gets) and
// self (this process's own loopback, which no other process reaches).
// Not: tcp, posix, sysv (gets emulated with messages the holder answers),
// cma (the reader's kernel copies from any address its ptrace rights
// reach), ud as a data wire (no RDMA read: emulated), knem/xpmem (map the
// holder's memory wholesale), cuda_ipc (opens whole device allocations,
// as TCP's same-host path would not: docs/security.md), or any other.
bool GetsCheckedByHardware(const Wire& w);

// "tcp/lo", ... for each of `wires` whose gets are not checked, in order.
std::vector<std::string> UncheckedGetWires(const std::vector<Wire>& wires);

// The FAILED_PRECONDITION a transport made without the opt-in returns where
// its context has `unchecked` wires (none: none usable at all), naming
// them, why, and the two ways on.
Status EmulatedGetsRefusal(const std::vector<std::string>& unchecked);

// The environment's choice (kEmulatedGetsEnv): true for "allow"; false when
// unset, empty or "refuse"; INVALID_ARGUMENT for anything else.
Result<bool> EmulatedGetsAllowedByEnv();

}  // namespace tensorhub::transport::ucx

#endif  // TENSORHUB_TRANSPORT_UCX_UCX_WIRES_H_
