import Foundation
import Synchronization

/// JSON strings for the JSON lines the processes write (logs, spans): escaped as RFC 8259 asks,
/// plus DEL, the C1 controls, U+2028 and U+2029, so a line is safe in a terminal and in
/// JavaScript.
public enum JSONString {
    private static let hex = Array("0123456789abcdef".utf8)

    public static func append(_ string: String, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        var s = string
        s.withUTF8 { bytes in
            // Most strings (names, keys, addresses, paths) are printable ASCII with nothing to
            // escape: their bytes go as they are, in one copy.
            var escape: UInt8 = 0
            for c in bytes { escape |= (c < 0x20 || c >= 0x7F || c == 0x22 || c == 0x5C) ? 1 : 0 }
            if escape == 0 {
                out.append(contentsOf: bytes)
                return
            }
            var i = 0
            let n = bytes.count
            while i < n {
                let b = bytes[i]
                switch b {
                case UInt8(ascii: "\""): out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\"")])
                case UInt8(ascii: "\\"): out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\\")])
                case 0x0A: out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "n")])
                case 0x0D: out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "r")])
                case 0x09: out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "t")])
                case 0x08: out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "b")])
                case 0x0C: out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "f")])
                case 0x00..<0x20, 0x7F:
                    out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0")])
                    out.append(hex[Int(b >> 4)])
                    out.append(hex[Int(b & 0xF)])
                case 0xC2 where i + 1 < n && (0x80...0x9F).contains(bytes[i + 1]):
                    // U+0080…U+009F, the C1 controls (U+009B starts a terminal escape too)
                    out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0")])
                    out.append(hex[Int(bytes[i + 1] >> 4)])
                    out.append(hex[Int(bytes[i + 1] & 0xF)])
                    i += 1
                case 0xE2 where i + 2 < n && bytes[i + 1] == 0x80 && (bytes[i + 2] == 0xA8 || bytes[i + 2] == 0xA9):
                    // U+2028 LINE SEPARATOR, U+2029 PARAGRAPH SEPARATOR
                    out.append(contentsOf: bytes[i + 2] == 0xA8 ? Array(#"\u2028"#.utf8) : Array(#"\u2029"#.utf8))
                    i += 2
                default:
                    out.append(b)
                }
                i += 1
            }
        }
        out.append(UInt8(ascii: "\""))
    }
}

/// A file descriptor that JSON lines (logs, spans) are written to, each with one `write(2)` under a lock (so
/// lines from many threads never interleave, even one longer than a pipe's atomic size), partial
/// writes and EINTR continued. The descriptor is not closed by this object: `standardError` is
/// the process's, and a test closes the pipe or file it passed.
public final class LogOutput: Sendable {
    public let fileDescriptor: Int32
    /// Held while a line is written; true when the last line was cut short (see `write`).
    private let lock = Mutex(false)

    public init(fileDescriptor: Int32) {
        self.fileDescriptor = fileDescriptor
    }

    /// The process's standard error, shared by every handler that writes there.
    public static let standardError = LogOutput(fileDescriptor: STDERR_FILENO)

    /// Writes `bytes` whole (a line is lost only when the descriptor refuses it: there is nowhere
    /// to report that). A line cut short (the descriptor stayed full for a second) is ended with a
    /// newline before the next one, so that one starts a line of its own.
    /// Returns whether all of `bytes` went out.
    @discardableResult
    public func write(_ bytes: [UInt8]) -> Bool {
        lock.withLock { cut in
            if cut {
                // The previous line was cut short: end it before this one.
                let newline: [UInt8] = [UInt8(ascii: "\n")]
                guard newline.withUnsafeBytes({ writeAll($0.baseAddress!, 1) }) == 1 else { return false }
                cut = false
            }
            let written = bytes.withUnsafeBytes { raw in raw.baseAddress.map { writeAll($0, raw.count) } ?? 0 }
            cut = written > 0 && written < bytes.count
            return written == bytes.count
        }
    }

    /// Bytes written before the descriptor refused more (all of them, normally).
    private func writeAll(_ base: UnsafeRawPointer, _ count: Int) -> Int {
        var offset = 0
        while offset < count {
            let n = systemWrite(fileDescriptor, base + offset, count - offset)
            if n > 0 {
                offset += n
            } else if n < 0 && errno == EINTR {
                continue
            } else if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) {
                // A non-blocking descriptor that is full: wait a little for room.
                var p = pollfd(fd: fileDescriptor, events: Int16(POLLOUT), revents: 0)
                if poll(&p, 1, 1000) <= 0 { return offset }
            } else {
                return offset
            }
        }
        return offset
    }
}

private func systemWrite(_ fd: Int32, _ bytes: UnsafeRawPointer, _ count: Int) -> Int {
    write(fd, bytes, count)
}
