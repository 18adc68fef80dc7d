import Foundation
import Logging
import Observability
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

/// JSON text for the log lines: strings escaped (`JSONString`), metadata values as strings,
/// objects and arrays.
enum JSONText {

    static func append(string: String, to out: inout [UInt8]) { JSONString.append(string, to: &out) }

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
