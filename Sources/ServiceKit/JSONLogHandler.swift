import Foundation
import Logging
import Synchronization

/// A swift-log `LogHandler` that writes one JSON object per line (`LOG_FORMAT=json`):
///
/// ```
/// {"ts":"2026-11-24T10:00:00.123456Z","level":"info","logger":"accounts","msg":"…","trace_id":"…","span_id":"…","rpc.code":"OK","source":"Accounts"}
/// ```
///
/// - `ts` is UTC with microseconds; `level` swift-log's name (`trace` … `critical`); `logger` the
///   logger's label; `msg` the message; `source` the module that logged.
/// - The metadata is merged as `StreamLogHandler` merges it (the handler's own, then the metadata
///   provider's, then the call's; the later wins), and each key becomes a field. Values are JSON
///   strings; nested metadata becomes objects (keys sorted) and arrays. An error passed to the log
///   call adds `error.message` and `error.type`.
/// - `trace_id` and `span_id`, when the merged metadata has them (the tracing's metadata provider
///   puts them there from the task-local span), come right after `msg`, always as strings.
/// - A metadata key that is one of the fixed fields (`ts`, `level`, `logger`, `msg`, `source`) is
///   written as `metadata.<key>`, so no object has a key twice.
/// - Every string is escaped: quotes, backslashes, every control character (C0, DEL, C1) and
///   U+2028, U+2029 as `\…` escapes, so a line never breaks and never drives a terminal; Swift
///   strings are valid Unicode (bytes that were not UTF-8 became U+FFFD when the string was made).
/// - A line is written with one `write(2)` under a lock shared by every handler of the output, so
///   lines from many threads never interleave (`LogOutput`).
public struct JSONLogHandler: LogHandler {
    public let label: String
    public var logLevel: Logger.Level
    public var metadata: Logger.Metadata = [:]
    public var metadataProvider: Logger.MetadataProvider?
    /// Where the lines go (standard error in a process; a pipe or a file in tests).
    public let output: LogOutput

    /// The fields every line starts or ends with, which metadata keys never replace.
    public static let fixedFields: Set<String> = ["ts", "level", "logger", "msg", "source"]
    /// Metadata keys written right after `msg` (the trace context).
    public static let traceFields = ["trace_id", "span_id"]

    public init(
        label: String, level: Logger.Level = .info, output: LogOutput = .standardError,
        metadataProvider: Logger.MetadataProvider? = LoggingSystem.metadataProvider
    ) {
        self.label = label
        self.logLevel = level
        self.output = output
        self.metadataProvider = metadataProvider
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        output.write(line(for: event, at: .now()))
    }

    /// The line `log` writes for `event` at `time`, with its newline.
    public func line(for event: LogEvent, at time: LogTimestamp) -> [UInt8] {
        var merged = metadata
        if let provided = metadataProvider?.get(), !provided.isEmpty { merged.merge(provided) { _, new in new } }
        if let explicit = event.metadata, !explicit.isEmpty { merged.merge(explicit) { _, new in new } }
        if let error = event.error {
            merged["error.message"] = "\(error)"
            merged["error.type"] = "\(String(reflecting: type(of: error)))"
        }

        var out: [UInt8] = []
        out.reserveCapacity(192 + event.message.description.utf8.count)
        out.append(contentsOf: #"{"ts":""#.utf8)
        time.append(to: &out)
        out.append(contentsOf: #"","level":"#.utf8)
        JSONText.append(string: event.level.rawValue, to: &out)
        out.append(contentsOf: #","logger":"#.utf8)
        JSONText.append(string: label, to: &out)
        out.append(contentsOf: #","msg":"#.utf8)
        JSONText.append(string: event.message.description, to: &out)
        for key in Self.traceFields {
            guard let value = merged.removeValue(forKey: key) else { continue }
            out.append(UInt8(ascii: ","))
            JSONText.append(string: key, to: &out)
            out.append(UInt8(ascii: ":"))
            if case .string(let s) = value { JSONText.append(string: s, to: &out) } else { JSONText.append(string: value.description, to: &out) }
        }
        if !merged.isEmpty {
            var used = Set(merged.keys)
            for (key, value) in merged.sorted(by: { $0.key < $1.key }) {
                var name = key
                if Self.fixedFields.contains(name) || Self.traceFields.contains(name) {
                    repeat { name = "metadata.\(name)" } while used.contains(name)
                    used.insert(name)
                }
                out.append(UInt8(ascii: ","))
                JSONText.append(string: name, to: &out)
                out.append(UInt8(ascii: ":"))
                JSONText.append(value: value, to: &out)
            }
        }
        out.append(contentsOf: #","source":"#.utf8)
        JSONText.append(string: event.source, to: &out)
        out.append(contentsOf: "}\n".utf8)
        return out
    }
}

/// A file descriptor that log lines are written to, each with one `write(2)` under a lock (so
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
    public func write(_ bytes: [UInt8]) {
        lock.withLock { cut in
            if cut {
                // The previous line was cut short: end it before this one.
                let newline: [UInt8] = [UInt8(ascii: "\n")]
                guard newline.withUnsafeBytes({ writeAll($0.baseAddress!, 1) }) == 1 else { return }
                cut = false
            }
            let written = bytes.withUnsafeBytes { raw in raw.baseAddress.map { writeAll($0, raw.count) } ?? 0 }
            cut = written > 0 && written < bytes.count
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

/// A wall-clock time as the JSON lines write it: `2026-11-24T10:00:00.123456Z` (UTC, microseconds).
public struct LogTimestamp: Sendable, Hashable {
    /// Seconds since the Unix epoch.
    public var seconds: Int
    /// 0..<1_000_000.
    public var microseconds: Int

    public init(seconds: Int, microseconds: Int) {
        self.seconds = seconds
        self.microseconds = microseconds
    }

    public static func now() -> LogTimestamp {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return LogTimestamp(seconds: Int(ts.tv_sec), microseconds: Int(ts.tv_nsec) / 1000)
    }

    /// The ISO 8601 text.
    public var text: String { var out: [UInt8] = []; append(to: &out); return String(decoding: out, as: UTF8.self) }

    func append(to out: inout [UInt8]) {
        var t = time_t(seconds)
        var parts = tm()
        gmtime_r(&t, &parts)
        func digits(_ value: Int, _ width: Int) {
            var divisor = 1
            for _ in 1..<width { divisor *= 10 }
            var v = value
            while divisor > 0 {
                out.append(UInt8(ascii: "0") + UInt8((v / divisor) % 10))
                v %= divisor
                divisor /= 10
            }
        }
        digits(Int(parts.tm_year) + 1900, 4)
        out.append(UInt8(ascii: "-"))
        digits(Int(parts.tm_mon) + 1, 2)
        out.append(UInt8(ascii: "-"))
        digits(Int(parts.tm_mday), 2)
        out.append(UInt8(ascii: "T"))
        digits(Int(parts.tm_hour), 2)
        out.append(UInt8(ascii: ":"))
        digits(Int(parts.tm_min), 2)
        out.append(UInt8(ascii: ":"))
        digits(Int(parts.tm_sec), 2)
        out.append(UInt8(ascii: "."))
        digits(max(0, min(microseconds, 999_999)), 6)
        out.append(UInt8(ascii: "Z"))
    }
}

/// JSON text for the log lines: strings escaped (RFC 8259, plus DEL, the C1 controls, U+2028 and
/// U+2029, so a line is safe in a terminal and in JavaScript), metadata values as strings, objects and arrays.
enum JSONText {
    private static let hex = Array("0123456789abcdef".utf8)

    static func append(string: String, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        var s = string
        s.withUTF8 { bytes in
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

    static func append(value: Logger.MetadataValue, to out: inout [UInt8]) {
        switch value {
        case .string(let s):
            append(string: s, to: &out)
        case .stringConvertible(let c):
            append(string: c.description, to: &out)
        case .dictionary(let d):
            out.append(UInt8(ascii: "{"))
            for (index, (key, value)) in d.sorted(by: { $0.key < $1.key }).enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                append(string: key, to: &out)
                out.append(UInt8(ascii: ":"))
                append(value: value, to: &out)
            }
            out.append(UInt8(ascii: "}"))
        case .array(let a):
            out.append(UInt8(ascii: "["))
            for (index, value) in a.enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                append(value: value, to: &out)
            }
            out.append(UInt8(ascii: "]"))
        }
    }
}
