// Which of UCX's wires the UCX transport may use by default (docs/security.md,
// "What a UCX peer can reach"; issue 27, item 5).
//
// The transport's contexts do not ask UCX for RMA, so no worker of it has
// UCX's handlers of emulated gets and puts, and a peer running an unmodified
// UCX reaches only the bytes a holder sends it. What is left is below UCP:
// UCX 1.13's tcp wire writes the bytes of a put request (a message of its
// own, uct_tcp_ep_handle_put_req) to whatever address it names, whatever the
// context's features, so a peer that modifies its UCX can write into a
// holder's (or a reader's) memory over tcp; cma lets a reader's kernel copy
// from any address its ptrace rights reach. Over RDMA (rc, dc) the NIC
// checks every remote access against a registration. So by default the
// transport runs only where every wire of its UCX context is an RDMA one (or
// a wire that only carries UCX's connection set-up, or this process's own
// loopback); the opt-in (TENSORHUB_UCX_EMULATED_GETS=allow,
// ClientOptions::ucx_emulated_gets; named when these wires carried emulated
// gets) keeps every wire, for networks whose every host runs the
// deployment's own binaries.
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

// Whether every remote access over `w` is checked against a registration
// by something other than the holder's CPU: rc_verbs, rc_mlx5 and dc_mlx5
// (the NIC), an auxiliary wire (carries no data) and self (this process's
// own loopback, which no other process reaches). Not: tcp (its put
// requests write wherever they name), posix, sysv (messages the holder's
// CPU handles, not examined further),
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
