/// SETTINGS values as HTTP/2 allows them, whatever a configuration asks for: a flow-control
/// window is at most 2³¹−1 bytes (RFC 9113 §6.5.2; more is a connection error at the peer), other
/// values fit in 32 bits. Nothing here traps on an out-of-range configuration.
enum HTTP2Setting {
    static let maxWindow = Int(Int32.max)

    /// A stream's initial window.
    static func window(_ bytes: Int) -> UInt32 { UInt32(min(max(bytes, 0), maxWindow)) }

    /// The connection's window: room for four streams' worth, within the limit (the client).
    static func connectionWindow(streamWindow bytes: Int) -> Int32 {
        Int32(clamping: min(max(bytes, 0), maxWindow) * 4)
    }

    /// The server's connection window: twice every stream's window (see
    /// `ServerConfiguration.connectionWindowSize`), at least nghttp2's 64 KiB, within the limit.
    static func connectionWindow(streamWindow bytes: Int, streams: Int) -> Int32 {
        let perStream = min(max(bytes, 0), maxWindow)
        let total = perStream.multipliedReportingOverflow(by: 2 * max(streams, 1))
        return Int32(clamping: total.overflow ? maxWindow : min(max(total.partialValue, 65535), maxWindow))
    }

    /// Any other value (stream counts, header list sizes).
    static func value(_ n: Int) -> UInt32 { UInt32(clamping: max(n, 0)) }
}
