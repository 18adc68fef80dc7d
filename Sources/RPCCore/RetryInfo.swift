/// RESOURCE_EXHAUSTED with a retry hint, for code that cannot use the contracts' message types
/// (the transport): `google.rpc.Status { code, message, details: [Any(google.rpc.RetryInfo)] }`
/// encoded by hand in `grpc-status-details-bin`, plus a `retry-after` trailer (seconds), the same
/// shape as `ServiceKit`'s `RPCError.retryLater`, so grpcio-status and grpc-go decode it.
extension RPCError {
    public static func resourceExhausted(_ message: String, retryAfter delay: Duration) -> RPCError {
        let seconds = max(1, delay.components.seconds)
        var duration: [UInt8] = [0x08]  // google.protobuf.Duration.seconds = 1 (varint)
        Protowire.varint(UInt64(seconds), into: &duration)
        var retryInfo: [UInt8] = []  // google.rpc.RetryInfo.retry_delay = 1
        Protowire.bytes(field: 1, duration, into: &retryInfo)
        var any: [UInt8] = []  // google.protobuf.Any: type_url = 1, value = 2
        Protowire.bytes(field: 1, Array("type.googleapis.com/google.rpc.RetryInfo".utf8), into: &any)
        Protowire.bytes(field: 2, retryInfo, into: &any)
        var status: [UInt8] = [0x08]  // google.rpc.Status: code = 1, message = 2, details = 3
        Protowire.varint(UInt64(StatusCode.resourceExhausted.rawValue), into: &status)
        Protowire.bytes(field: 2, Array(message.utf8), into: &status)
        Protowire.bytes(field: 3, any, into: &status)
        var trailers = Metadata()
        trailers.add("retry-after", String(seconds))
        return RPCError(.resourceExhausted, message, trailers: trailers, details: status)
    }
}

/// The two wire-format pieces `resourceExhausted(_:retryAfter:)` needs.
enum Protowire {
    static func varint(_ v: UInt64, into out: inout [UInt8]) {
        var v = v
        while v >= 0x80 {
            out.append(UInt8(truncatingIfNeeded: v) | 0x80)
            v >>= 7
        }
        out.append(UInt8(v))
    }
    static func bytes(field: UInt64, _ value: [UInt8], into out: inout [UInt8]) {
        varint(field << 3 | 2, into: &out)
        varint(UInt64(value.count), into: &out)
        out += value
    }
}
