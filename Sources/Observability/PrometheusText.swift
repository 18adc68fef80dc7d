/// One sample of a Prometheus text exposition: `name{label="value",...} value`.
public struct PrometheusSample: Sendable, Equatable {
    public var name: String
    public var labels: [String: String]
    public var value: Double

    public init(name: String, labels: [String: String] = [:], value: Double) {
        self.name = name
        self.labels = labels
        self.value = value
    }

    public subscript(label: String) -> String? { labels[label] }
}

/// A parsed Prometheus text exposition (format 0.0.4, what every process's `GET /metrics`
/// serves, and the OpenMetrics lines that share its syntax): the samples, and the type each
/// `# TYPE` line declares. Only what reading our own processes needs: counters, gauges and the
/// `_bucket`/`_sum`/`_count` lines of histograms and summaries, each as a plain sample.
///
/// Lenient where a scraper must be: `# HELP`, `# TYPE` and any other comment, blank lines, `\r\n`,
/// spaces and tabs between tokens, a trailing comma in a label set, an optional timestamp (and an
/// OpenMetrics exemplar) after the value are all accepted; label values are unescaped (`\\`, `\"`,
/// `\n`); values may be `NaN`, `+Inf`, `-Inf`. A line that cannot be read (a bad name, an
/// unterminated label value, a value that is not a number) is skipped and counted, never fatal.
public struct PrometheusExposition: Sendable {
    public var samples: [PrometheusSample] = []
    /// `# TYPE` declarations, by metric family name (`counter`, `gauge`, `histogram`, ...).
    public var types: [String: String] = [:]
    /// Lines skipped because they could not be read.
    public var skippedLines = 0

    public init(samples: [PrometheusSample] = [], types: [String: String] = [:]) {
        self.samples = samples
        self.types = types
    }

    public init(parsing text: String) { self.init(parsing: Array(text.utf8)) }

    public init(parsing bytes: [UInt8]) {
        bytes.withUnsafeBufferPointer { buf in
            var start = 0
            while start < buf.count {
                var end = start
                while end < buf.count && buf[end] != UInt8(ascii: "\n") { end += 1 }
                var lineEnd = end
                if lineEnd > start && buf[lineEnd - 1] == UInt8(ascii: "\r") { lineEnd -= 1 }
                var line = LineReader(bytes: buf, at: start, end: lineEnd)
                line.read(into: &self)
                start = end + 1
            }
        }
    }

    /// The samples named `name`.
    public func samples(named name: String) -> [PrometheusSample] { samples.filter { $0.name == name } }

    /// The value of the sample named `name` whose labels include all of `labels` (the first one).
    public func value(_ name: String, _ labels: [String: String] = [:]) -> Double? {
        samples.first { s in s.name == name && labels.allSatisfy { k, v in s.labels[k] == v } }?.value
    }

    /// The sum of the samples named `name` that `include` accepts (0 when there are none).
    public func sum(_ name: String, where include: (PrometheusSample) -> Bool = { _ in true }) -> Double {
        samples.reduce(0) { $1.name == name && include($1) ? $0 + $1.value : $0 }
    }
}

/// Reads one line of an exposition.
private struct LineReader {
    let bytes: UnsafeBufferPointer<UInt8>
    var i: Int
    let end: Int

    init(bytes: UnsafeBufferPointer<UInt8>, at start: Int, end: Int) {
        self.bytes = bytes
        self.i = start
        self.end = end
    }

    var atEnd: Bool { i >= end }
    var peek: UInt8? { i < end ? bytes[i] : nil }

    mutating func skipBlanks() {
        while i < end, bytes[i] == UInt8(ascii: " ") || bytes[i] == UInt8(ascii: "\t") { i += 1 }
    }

    /// `[a-zA-Z_:][a-zA-Z0-9_:]*` (label names: without `:`, which we accept anyway).
    mutating func name() -> String? {
        let start = i
        while i < end {
            let b = bytes[i]
            let letter = (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A) || b == UInt8(ascii: "_") || b == UInt8(ascii: ":")
            let digit = b >= 0x30 && b <= 0x39
            guard letter || (digit && i > start) else { break }
            i += 1
        }
        return i > start ? String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<i]), as: UTF8.self) : nil
    }

    /// Up to the next blank or the end of the line.
    mutating func token() -> String? {
        let start = i
        while i < end, bytes[i] != UInt8(ascii: " "), bytes[i] != UInt8(ascii: "\t") { i += 1 }
        return i > start ? String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<i]), as: UTF8.self) : nil
    }

    /// A double-quoted label value (the opening quote already read), unescaped.
    mutating func quoted() -> String? {
        var out: [UInt8] = []
        while i < end {
            let b = bytes[i]
            i += 1
            switch b {
            case UInt8(ascii: "\""): return String(decoding: out, as: UTF8.self)
            case UInt8(ascii: "\\"):
                guard i < end else { return nil }
                let e = bytes[i]
                i += 1
                switch e {
                case UInt8(ascii: "n"): out.append(UInt8(ascii: "\n"))
                case UInt8(ascii: "\\"), UInt8(ascii: "\""): out.append(e)
                default: out += [b, e]  // not an escape the format defines: kept as written
                }
            default: out.append(b)
            }
        }
        return nil  // unterminated
    }

    mutating func read(into e: inout PrometheusExposition) {
        skipBlanks()
        guard let first = peek else { return }  // blank line
        if first == UInt8(ascii: "#") {
            i += 1
            skipBlanks()
            guard token() == "TYPE" else { return }  // HELP and any other comment
            skipBlanks()
            guard let family = name() else { return }
            skipBlanks()
            if let type = token() { e.types[family] = type }
            return
        }
        if let sample = sample() { e.samples.append(sample) } else { e.skippedLines += 1 }
    }

    mutating func sample() -> PrometheusSample? {
        guard let name = name() else { return nil }
        var labels: [String: String] = [:]
        skipBlanks()
        if peek == UInt8(ascii: "{") {
            i += 1
            while true {
                skipBlanks()
                if peek == UInt8(ascii: "}") {
                    i += 1
                    break
                }
                guard let label = self.name() else { return nil }
                skipBlanks()
                guard peek == UInt8(ascii: "=") else { return nil }
                i += 1
                skipBlanks()
                guard peek == UInt8(ascii: "\"") else { return nil }
                i += 1
                guard let value = quoted() else { return nil }
                labels[label] = value
                skipBlanks()
                if peek == UInt8(ascii: ",") {
                    i += 1
                } else if peek != UInt8(ascii: "}") {
                    return nil
                }
            }
            skipBlanks()
        }
        guard let text = token(), let value = Self.number(text) else { return nil }
        // A timestamp, an exemplar: not needed here.
        return PrometheusSample(name: name, labels: labels, value: value)
    }

    static func number(_ s: String) -> Double? {
        switch s {
        case "+Inf", "Inf", "+inf", "inf": return .infinity
        case "-Inf", "-inf": return -.infinity
        case "NaN", "nan": return .nan
        default:
            // Decimal numbers only (Double(String) would also take hexadecimal and "infinity").
            guard s.utf8.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || $0 == 0x2E || $0 == 0x2B || $0 == 0x2D || $0 == 0x65 || $0 == 0x45 }) else {
                return nil
            }
            return Double(s)
        }
    }
}
