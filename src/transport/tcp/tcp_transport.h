// The TCP data plane: framed range reads (wire/frame.h), zero-copy on both
// ends. The holder sends straight from its registered buffers with one
// sendmsg over [header, pieces...]; the reader receives straight into its
// destination with recvmsg over the destination pieces.
#ifndef TENSORHUB_TRANSPORT_TCP_TCP_TRANSPORT_H_
#define TENSORHUB_TRANSPORT_TCP_TCP_TRANSPORT_H_

#include <memory>

#include "transport/transport.h"

namespace tensorhub::transport {

std::unique_ptr<Transport> MakeTcpTransport();

}  // namespace tensorhub::transport

#endif  // TENSORHUB_TRANSPORT_TCP_TCP_TRANSPORT_H_
