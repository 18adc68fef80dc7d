/// `grpc-message` percent-encoding: bytes outside printable ASCII (0x20–0x7E) and `%` itself are
/// sent as `%XX` of their UTF-8 encoding, so tabs, CR/LF and any Unicode survive HTTP/2 headers.
public enum PercentEncoding {
    private static let hex: [UInt8] = Array("0123456789ABCDEF".utf8)

    public static func encode(_ s: String) -> String {
        var needs = false
        for b in s.utf8 where b < 0x20 || b > 0x7E || b == UInt8(ascii: "%") { needs = true; break }
        if !needs { return s }
        var out: [UInt8] = []
        out.reserveCapacity(s.utf8.count * 3)
        for b in s.utf8 {
            if b < 0x20 || b > 0x7E || b == UInt8(ascii: "%") {
                out.append(UInt8(ascii: "%")); out.append(hex[Int(b >> 4)]); out.append(hex[Int(b & 0xF)])
            } else {
                out.append(b)
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Decodes leniently: a malformed escape is kept as is, invalid UTF-8 becomes U+FFFD.
    public static func decode(_ s: String) -> String {
        guard s.utf8.contains(UInt8(ascii: "%")) else { return s }
        return String(decoding: decodeBytes(Array(s.utf8)), as: UTF8.self)
    }

    /// The bytes `%XX` escapes stand for (a malformed escape kept as is); `plusIsSpace` for form
    /// and query encoding, where `+` is a space.
    public static func decodeBytes(_ bytes: [UInt8], plusIsSpace: Bool = false) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var i = 0
        func hexValue(_ c: UInt8) -> UInt8? {
            switch c {
            case 48...57: c - 48
            case 65...70: c - 55
            case 97...102: c - 87
            default: nil
            }
        }
        while i < bytes.count {
            if bytes[i] == UInt8(ascii: "%"), i + 2 < bytes.count, let h = hexValue(bytes[i + 1]), let l = hexValue(bytes[i + 2]) {
                out.append(h << 4 | l)
                i += 3
            } else {
                out.append(plusIsSpace && bytes[i] == UInt8(ascii: "+") ? 32 : bytes[i])
                i += 1
            }
        }
        return out
    }
}
