// Transport per peer (docs/design.md, "Transport per peer"): a worker
// serves TCP, which every worker speaks, and besides it the other
// transports it was asked for and can run (UCX). It advertises them through
// the hub (RegisterWorker's endpoints); a reader dials each holder over the
// first transport of its own preference that the holder lists, else TCP.
//
// To the fetcher this is one transport::Transport: the address it dials
// names the transport ("ucx://HOST:PORT"; a bare HOST:PORT is TCP), chosen
// once per source by DialAddress.
#ifndef TENSORHUB_CLIENT_TRANSPORT_SET_H_
#define TENSORHUB_CLIENT_TRANSPORT_SET_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tensorhub/types.h"
#include "transport/transport.h"

namespace tensorhub::client {

// `others`: the transports besides TCP, in order of preference (none is
// "tcp"); `tcp` must not be null.
std::unique_ptr<transport::Transport> MakeTransportSet(
    std::unique_ptr<transport::Transport> tcp,
    std::vector<std::unique_ptr<transport::Transport>> others);

// The address a reader whose transports are `preference` (in order; "tcp"
// may be among them, and ends the search) dials for a holder at TCP address
// `data_address` that also serves `endpoints`: "NAME://ADDRESS" for the
// first of its preference the holder lists, else `data_address`. (A holder
// on the reader's own host is moved to TCP when its UCX hello says so:
// UcxTransportOptions::refuse_same_host.)
std::string DialAddress(const std::vector<std::string>& preference,
                        const std::string& data_address,
                        const std::vector<DataEndpoint>& endpoints);

// The transport a dial address goes over: its scheme, or "tcp".
std::string_view TransportOf(std::string_view dial_address);

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_TRANSPORT_SET_H_
