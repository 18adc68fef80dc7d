/// The little JSON a token needs: writing flat objects, and parsing any JSON object strictly.
///
/// Why not Foundation: `JSONSerialization` bridges through `NSDictionary`/`NSNumber` and costs
/// several microseconds per token, and the gateway verifies a token on every request. This parser
/// works on the UTF-8 bytes directly, rejects duplicate keys (two `sub` claims must not be read
/// differently by two parsers), and bounds nesting.
enum TokenJSON {
    enum Value: Equatable {
        case string(String)
        case integer(Int64)
        case double(Double)
        case bool(Bool)
        case null
        case array([Value])
        case object([String: Value])
    }

    enum Member {
        case string(String)
        case integer(Int64)
    }

    /// `{"k":"v","n":1}` with keys and values in the given order.
    static func object(_ members: [(String, Member)]) -> String {
        var out = "{"
        for (i, (key, value)) in members.enumerated() {
            if i > 0 { out += "," }
            appendString(key, to: &out)
            out += ":"
            switch value {
            case .string(let s): appendString(s, to: &out)
            case .integer(let n): out += String(n)
            }
        }
        out += "}"
        return out
    }

    static func appendString(_ s: String, to out: inout String) {
        out += "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case let c where c.value < 0x20:
                let hex = String(c.value, radix: 16)
                out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: out.unicodeScalars.append(scalar)
            }
        }
        out += "\""
    }

    /// Parses a JSON object; nil for anything else or anything malformed.
    static func parseObject(_ bytes: [UInt8]) -> [String: Value]? {
        var parser = Parser(bytes: bytes)
        guard case .object(let members)? = parser.parseDocument() else { return nil }
        return members
    }

    struct Parser {
        let bytes: [UInt8]
        var i = 0
        var depth = 0
        static let maximumDepth = 16

        init(bytes: [UInt8]) { self.bytes = bytes }

        mutating func parseDocument() -> Value? {
            guard let value = parseValue() else { return nil }
            skipWhitespace()
            return i == bytes.count ? value : nil
        }

        mutating func skipWhitespace() {
            while i < bytes.count, bytes[i] == 0x20 || bytes[i] == 0x0A || bytes[i] == 0x0D || bytes[i] == 0x09 { i += 1 }
        }

        mutating func parseValue() -> Value? {
            skipWhitespace()
            guard i < bytes.count else { return nil }
            switch bytes[i] {
            case UInt8(ascii: "{"): return parseObjectValue()
            case UInt8(ascii: "["): return parseArray()
            case UInt8(ascii: "\""): return parseString().map(Value.string)
            case UInt8(ascii: "t"): return literal("true", .bool(true))
            case UInt8(ascii: "f"): return literal("false", .bool(false))
            case UInt8(ascii: "n"): return literal("null", .null)
            default: return parseNumber()
            }
        }

        mutating func literal(_ word: StaticString, _ value: Value) -> Value? {
            let n = word.utf8CodeUnitCount
            guard i + n <= bytes.count else { return nil }
            for k in 0..<n where bytes[i + k] != word.utf8Start[k] { return nil }
            i += n
            return value
        }

        mutating func parseObjectValue() -> Value? {
            depth += 1
            defer { depth -= 1 }
            guard depth <= Self.maximumDepth else { return nil }
            i += 1  // {
            var members: [String: Value] = [:]
            skipWhitespace()
            if i < bytes.count, bytes[i] == UInt8(ascii: "}") {
                i += 1
                return .object(members)
            }
            while true {
                skipWhitespace()
                guard i < bytes.count, bytes[i] == UInt8(ascii: "\""), let key = parseString() else { return nil }
                skipWhitespace()
                guard i < bytes.count, bytes[i] == UInt8(ascii: ":") else { return nil }
                i += 1
                guard let value = parseValue(), members.updateValue(value, forKey: key) == nil else { return nil }  // duplicate key
                skipWhitespace()
                guard i < bytes.count else { return nil }
                if bytes[i] == UInt8(ascii: ",") {
                    i += 1
                    continue
                }
                guard bytes[i] == UInt8(ascii: "}") else { return nil }
                i += 1
                return .object(members)
            }
        }

        mutating func parseArray() -> Value? {
            depth += 1
            defer { depth -= 1 }
            guard depth <= Self.maximumDepth else { return nil }
            i += 1  // [
            var elements: [Value] = []
            skipWhitespace()
            if i < bytes.count, bytes[i] == UInt8(ascii: "]") {
                i += 1
                return .array(elements)
            }
            while true {
                guard let value = parseValue() else { return nil }
                elements.append(value)
                skipWhitespace()
                guard i < bytes.count else { return nil }
                if bytes[i] == UInt8(ascii: ",") {
                    i += 1
                    continue
                }
                guard bytes[i] == UInt8(ascii: "]") else { return nil }
                i += 1
                return .array(elements)
            }
        }

        mutating func parseString() -> String? {
            i += 1  // opening quote
            let start = i
            // Fast path: no escapes.
            while i < bytes.count, bytes[i] != UInt8(ascii: "\""), bytes[i] != UInt8(ascii: "\\"), bytes[i] >= 0x20 { i += 1 }
            guard i < bytes.count else { return nil }
            if bytes[i] == UInt8(ascii: "\"") {
                let s = String(validating: bytes[start..<i], as: UTF8.self)
                i += 1
                return s
            }
            var out = Array(bytes[start..<i])
            while i < bytes.count {
                let c = bytes[i]
                if c == UInt8(ascii: "\"") {
                    i += 1
                    return String(validating: out, as: UTF8.self)
                }
                if c < 0x20 { return nil }
                if c != UInt8(ascii: "\\") {
                    out.append(c)
                    i += 1
                    continue
                }
                i += 1
                guard i < bytes.count else { return nil }
                let e = bytes[i]
                i += 1
                switch e {
                case UInt8(ascii: "\""): out.append(0x22)
                case UInt8(ascii: "\\"): out.append(0x5C)
                case UInt8(ascii: "/"): out.append(0x2F)
                case UInt8(ascii: "b"): out.append(0x08)
                case UInt8(ascii: "f"): out.append(0x0C)
                case UInt8(ascii: "n"): out.append(0x0A)
                case UInt8(ascii: "r"): out.append(0x0D)
                case UInt8(ascii: "t"): out.append(0x09)
                case UInt8(ascii: "u"):
                    guard var scalar = hex4() else { return nil }
                    if (0xD800..<0xDC00).contains(scalar) {
                        // A high surrogate must be followed by an escaped low one.
                        guard i + 1 < bytes.count, bytes[i] == UInt8(ascii: "\\"), bytes[i + 1] == UInt8(ascii: "u") else { return nil }
                        i += 2
                        guard let low = hex4(), (0xDC00..<0xE000).contains(low) else { return nil }
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    } else if (0xDC00..<0xE000).contains(scalar) {
                        return nil
                    }
                    guard let u = Unicode.Scalar(scalar) else { return nil }
                    out.append(contentsOf: Array(String(Character(u)).utf8))
                default:
                    return nil
                }
            }
            return nil
        }

        mutating func hex4() -> UInt32? {
            guard i + 4 <= bytes.count else { return nil }
            var v: UInt32 = 0
            for _ in 0..<4 {
                let c = bytes[i]
                let d: UInt32
                switch c {
                case 0x30...0x39: d = UInt32(c - 0x30)
                case 0x41...0x46: d = UInt32(c - 0x41 + 10)
                case 0x61...0x66: d = UInt32(c - 0x61 + 10)
                default: return nil
                }
                v = v << 4 | d
                i += 1
            }
            return v
        }

        mutating func parseNumber() -> Value? {
            let start = i
            if i < bytes.count, bytes[i] == UInt8(ascii: "-") { i += 1 }
            let digitsStart = i
            while i < bytes.count, (0x30...0x39).contains(bytes[i]) { i += 1 }
            let intDigits = i - digitsStart
            guard intDigits > 0 else { return nil }
            if intDigits > 1, bytes[digitsStart] == 0x30 { return nil }  // no leading zeros
            var isInteger = true
            if i < bytes.count, bytes[i] == UInt8(ascii: ".") {
                isInteger = false
                i += 1
                let f = i
                while i < bytes.count, (0x30...0x39).contains(bytes[i]) { i += 1 }
                guard i > f else { return nil }
            }
            if i < bytes.count, bytes[i] == UInt8(ascii: "e") || bytes[i] == UInt8(ascii: "E") {
                isInteger = false
                i += 1
                if i < bytes.count, bytes[i] == UInt8(ascii: "+") || bytes[i] == UInt8(ascii: "-") { i += 1 }
                let e = i
                while i < bytes.count, (0x30...0x39).contains(bytes[i]) { i += 1 }
                guard i > e else { return nil }
            }
            let text = String(decoding: bytes[start..<i], as: UTF8.self)
            if isInteger, let n = Int64(text) { return .integer(n) }
            return Double(text).map(Value.double)
        }
    }
}
