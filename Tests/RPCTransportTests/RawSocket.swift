import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A blocking TCP client on loopback for tests that need bytes no HTTP library sends, and to see
/// when the server closes the connection.
final class RawSocket: @unchecked Sendable {
    let fd: Int32

    /// Connects (the descriptor is closed by `deinit` only, connected or not: closing it twice
    /// could close a descriptor another test's connection got meanwhile).
    init(port: Int) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = in_port_t(UInt16(port).bigEndian)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        var rc: Int32
        repeat {
            rc = withUnsafePointer(to: &addr) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
        } while rc != 0 && errno == EINTR
        guard rc == 0 else { throw POSIXError(.ECONNREFUSED) }
    }

    deinit { close(fd) }

    @discardableResult
    func send(_ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) } == bytes.count
    }
    func send(_ text: String) { send(Array(text.utf8)) }

    /// Reads until the peer closes the connection or `timeout` passes (generous: it separates
    /// "closed" from "left open", it does not time anything). Returns what was read and whether
    /// the connection was closed. Blocks a thread of its own, not one of the concurrency pool's
    /// (two on this machine: other tests' tasks would starve meanwhile).
    func readUntilClosed(
        timeout: Duration = .seconds(10), stopWhen: @escaping @Sendable ([UInt8]) -> Bool = { _ in false }
    ) async -> (bytes: [UInt8], closed: Bool) {
        let fd = self.fd
        return await withCheckedContinuation { c in
            Thread { c.resume(returning: RawSocket.blockingRead(fd, timeout: timeout, stopWhen: stopWhen)) }.start()
        }
    }

    private static func blockingRead(_ fd: Int32, timeout: Duration, stopWhen: ([UInt8]) -> Bool) -> (bytes: [UInt8], closed: Bool) {
        var out: [UInt8] = []
        let end = ContinuousClock.now + timeout
        var buf = [UInt8](repeating: 0, count: 65536)
        while ContinuousClock.now < end {
            var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let left = max(1, Int32((end - .now).milliseconds))
            guard poll(&p, 1, min(left, 100)) >= 0 else { return (out, true) }
            if p.revents == 0 { continue }
            let n = buf.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { return (out, true) }
            out += buf[0..<n]
            if stopWhen(out) { return (out, false) }
        }
        return (out, false)
    }
}

/// HTTP/2 frames from raw bytes: (type, flags, stream id, payload) until the bytes run out.
func http2Frames(_ bytes: [UInt8]) -> [(type: UInt8, flags: UInt8, stream: UInt32, payload: [UInt8])] {
    var out: [(type: UInt8, flags: UInt8, stream: UInt32, payload: [UInt8])] = []
    var i = 0
    while bytes.count - i >= 9 {
        let len = Int(bytes[i]) << 16 | Int(bytes[i + 1]) << 8 | Int(bytes[i + 2])
        guard bytes.count - i - 9 >= len else { break }
        let stream = UInt32(bytes[i + 5] & 0x7f) << 24 | UInt32(bytes[i + 6]) << 16 | UInt32(bytes[i + 7]) << 8 | UInt32(bytes[i + 8])
        out.append((bytes[i + 3], bytes[i + 4], stream, Array(bytes[(i + 9)..<(i + 9 + len)])))
        i += 9 + len
    }
    return out
}

enum H2 {
    static let preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)
    static let emptySettings: [UInt8] = [0, 0, 0, 4, 0, 0, 0, 0, 0]
    static let settingsAck: [UInt8] = [0, 0, 0, 4, 1, 0, 0, 0, 0]
    static let ping: UInt8 = 6
    static let goaway: UInt8 = 7

    /// A DATA frame.
    static func data(stream: UInt32, _ payload: [UInt8], endStream: Bool) -> [UInt8] {
        let len = payload.count
        return [
            UInt8(len >> 16 & 0xff), UInt8(len >> 8 & 0xff), UInt8(len & 0xff), 0, endStream ? 1 : 0,
            UInt8(stream >> 24 & 0x7f), UInt8(stream >> 16 & 0xff), UInt8(stream >> 8 & 0xff), UInt8(stream & 0xff),
        ] + payload
    }

    /// One length-prefixed gRPC message.
    static func grpcMessage(_ payload: [UInt8]) -> [UInt8] {
        let n = payload.count
        return [0, UInt8(n >> 24 & 0xff), UInt8(n >> 16 & 0xff), UInt8(n >> 8 & 0xff), UInt8(n & 0xff)] + payload
    }

    /// A gRPC request's HEADERS frame (HPACK literals without indexing, END_HEADERS set).
    static func headers(stream: UInt32, path: String, endStream: Bool) -> [UInt8] {
        var block: [UInt8] = []
        for (n, v) in [
            (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "test"),
            ("content-type", "application/grpc"), ("te", "trailers"),
        ] {
            block += [0x00, UInt8(n.utf8.count)] + Array(n.utf8) + [UInt8(v.utf8.count)] + Array(v.utf8)
        }
        let len = block.count
        let flags: UInt8 = 0x4 | (endStream ? 0x1 : 0)
        return [
            UInt8(len >> 16 & 0xff), UInt8(len >> 8 & 0xff), UInt8(len & 0xff), 1, flags,
            UInt8(stream >> 24 & 0x7f), UInt8(stream >> 16 & 0xff), UInt8(stream >> 8 & 0xff), UInt8(stream & 0xff),
        ] + block
    }
}
