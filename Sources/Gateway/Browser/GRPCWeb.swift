import RPCCore
import RPCTransport

/// gRPC-Web (https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-WEB.md) for browsers, over
/// HTTP/1.1 and HTTP/2, unary and server-streaming methods.
///
/// - `application/grpc-web` and `application/grpc-web+proto`: the body is gRPC's length-prefixed
///   messages; `application/grpc-web-text` (`+proto`): the same, base64-encoded (the request may
///   be several padded base64 chunks one after the other; each response frame is its own padded
///   chunk, as the spec allows); `application/grpc-web+json` (a sub-type the spec names, what
///   connect-es sends with `useBinaryFormat: false`): the same frames holding JSON messages,
///   transcoded from the descriptors as Connect JSON is. Other sub-types: 415.
/// - The response's status and trailers are its last frame, flag `0x80`, holding
///   `grpc-status: 0\r\ngrpc-message: ...\r\n` (HTTP/1 header lines, names lower-case, `-bin`
///   values base64). A call that fails before its first message is answered trailers-only: HTTP
///   200, the status in headers, an empty body.
/// - `grpc-timeout` is the deadline (capped as for gRPC). Compression as the spec allows: a
///   request message may be gzip-compressed (flag 1 with `grpc-encoding: gzip`) and a request
///   body gzip'd as a whole (`content-encoding: gzip`); responses are not compressed per message
///   (the spec says browsers cannot undo it), and unary responses over 1 KiB are gzip'd whole
///   when the request's `accept-encoding` lists gzip (browsers undo that themselves).
enum GRPCWeb {
    /// What a request's content type selects; nil when it is not gRPC-Web (or a sub-type other
    /// than proto and binary JSON).
    static func format(mediaType: String) -> Format? {
        switch mediaType {
        case "application/grpc-web", "application/grpc-web+proto": .binary
        case "application/grpc-web-text", "application/grpc-web-text+proto": .text
        case "application/grpc-web+json": .json
        default: nil
        }
    }

    static let supportedTypes = "application/grpc-web(+proto), application/grpc-web-text(+proto) or application/grpc-web+json"

    static func isGRPCWeb(mediaType: String) -> Bool { mediaType.hasPrefix("application/grpc-web") }

    enum Format {
        /// Binary frames of protobuf messages; the same in base64; binary frames of JSON messages.
        case binary, text, json

        var contentType: String {
            switch self {
            case .binary: "application/grpc-web+proto"
            case .text: "application/grpc-web-text+proto"
            case .json: "application/grpc-web+json"
            }
        }

        /// Response bytes as they go on the wire (text: base64, padded).
        func wire(_ bytes: [UInt8]) -> [UInt8] {
            switch self {
            case .binary, .json: bytes
            case .text: Array(Base64.encode(bytes, padded: true).utf8)
            }
        }
    }

    /// A base64 body that may be several padded chunks one after another (a chunk ends with its
    /// padding), each decoded by `Base64.decode`; line breaks are ignored. Nil when it is not base64.
    static func decodeText(_ body: [UInt8]) -> [UInt8]? {
        var out: [UInt8] = []
        out.reserveCapacity(body.count * 3 / 4)
        var chunk: [UInt8] = []
        func flush() -> Bool {
            // A padded chunk is whole groups of 4; any chunk holds at least 2 characters of data.
            if chunk.last == UInt8(ascii: "="), chunk.count % 4 != 0 { return false }
            guard chunk.lazy.filter({ $0 != UInt8(ascii: "=") }).count >= 2,
                let bytes = Base64.decode(String(decoding: chunk, as: UTF8.self))
            else { return false }
            out.append(contentsOf: bytes)
            chunk.removeAll(keepingCapacity: true)
            return true
        }
        for c in body where c != 13 && c != 10 {
            if c != UInt8(ascii: "="), chunk.last == UInt8(ascii: "="), !flush() { return nil }
            chunk.append(c)
        }
        if !chunk.isEmpty, !flush() { return nil }
        return out
    }

    /// One length-prefixed frame.
    static func frame(_ payload: [UInt8], flag: UInt8 = 0) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(payload.count + 5)
        let n = UInt32(payload.count)
        out.append(flag)
        out.append(UInt8(n >> 24 & 0xFF))
        out.append(UInt8(n >> 16 & 0xFF))
        out.append(UInt8(n >> 8 & 0xFF))
        out.append(UInt8(n & 0xFF))
        out.append(contentsOf: payload)
        return out
    }

    /// The status and trailers as header lines (`name: value\r\n`).
    static func statusLines(_ status: RPCError, trailers: Metadata) -> [(name: String, value: String)] {
        var lines: [(name: String, value: String)] = [("grpc-status", String(status.code.rawValue))]
        if !status.message.isEmpty { lines.append(("grpc-message", PercentEncoding.encode(status.message))) }
        if let details = status.details { lines.append(("grpc-status-details-bin", Base64.encode(details))) }
        for (key, value) in trailers where !Metadata.isReserved(key) {
            switch value {
            case .string(let s): lines.append((key, s))
            case .binary(let b): lines.append((key, Base64.encode(b)))
            }
        }
        for (key, value) in status.trailers where !Metadata.isReserved(key) {
            switch value {
            case .string(let s): lines.append((key, s))
            case .binary(let b): lines.append((key, Base64.encode(b)))
            }
        }
        return lines
    }

    /// The trailers frame (flag 0x80) that ends every response with a body.
    static func trailersFrame(_ status: RPCError, trailers: Metadata) -> [UInt8] {
        var block: [UInt8] = []
        for (name, value) in statusLines(status, trailers: trailers) {
            block.append(contentsOf: name.utf8)
            block.append(contentsOf: ": ".utf8)
            block.append(contentsOf: value.utf8.map { $0 == 13 || $0 == 10 ? 32 : $0 })
            block.append(contentsOf: "\r\n".utf8)
        }
        return frame(block, flag: 0x80)
    }

    /// The one request message of a unary or server-streaming call, from the (decoded) body:
    /// exactly one frame, within `limit`, decompressed when flagged.
    static func singleMessage(_ body: [UInt8], limit: Int, path: String, encoding: String?) throws -> [UInt8] {
        guard body.count >= 5 else {
            if body.isEmpty { throw RPCError(.unimplemented, "\(path) takes exactly one request message, got none") }
            throw RPCError(.invalidArgument, "the body ends inside a message prefix (\(body.count) of 5 bytes): truncated frame")
        }
        let flag = body[0]
        let length = Int(body[1]) << 24 | Int(body[2]) << 16 | Int(body[3]) << 8 | Int(body[4])
        guard flag & 0x80 == 0, flag <= 1 else { throw RPCError(.invalidArgument, "invalid gRPC-Web message flag \(flag)") }
        if length > limit {
            throw RPCError(.resourceExhausted, "request message of \(length) bytes exceeds the limit of \(limit) bytes for \(path)")
        }
        guard body.count >= 5 + length else {
            throw RPCError(
                .invalidArgument, "the body ends inside a message: its prefix says \(length) bytes, \(body.count - 5) arrived (truncated frame)")
        }
        guard body.count == 5 + length else {
            throw RPCError(.unimplemented, "\(path) takes exactly one request message, got more")
        }
        let message = Array(body[5...])
        guard flag == 1 else { return message }
        guard let encoding, encoding != "identity" else {
            throw RPCError(.invalidArgument, "compressed message received but the request has no grpc-encoding")
        }
        guard encoding == "gzip" else {
            throw RPCError(.unimplemented, "message encoding '\(encoding)' is not supported; use gzip or identity")
        }
        return try Gzip.inflateRequest(message, limit: limit, what: "request message", path: path)
    }
}

extension Gzip {
    /// A gzip'd request body or message, inflated within `limit`: past it RESOURCE_EXHAUSTED (as
    /// gRPC answers), not gzip INVALID_ARGUMENT; `what` names it in the message.
    static func inflateRequest(_ bytes: [UInt8], limit: Int, what: String, path: String) throws -> [UInt8] {
        do { return try decompress(bytes, limit: limit) } catch is TooLarge {
            throw RPCError(.resourceExhausted, "decompressed \(what) exceeds the limit of \(limit) bytes for \(path)")
        } catch {
            throw RPCError(.invalidArgument, "\(what) is not valid gzip")
        }
    }
}
