/// Standard base64 (`-bin` metadata sends it unpadded; proto3 JSON padded). Decoding accepts
/// padded or not, and the URL-safe alphabet too.
public enum Base64 {
    private static let alphabet: [UInt8] = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
    private static let reverse: [Int8] = {
        var t = [Int8](repeating: -1, count: 256)
        for (i, c) in alphabet.enumerated() { t[Int(c)] = Int8(i) }
        t[Int(UInt8(ascii: "-"))] = 62  // url-safe variants are accepted too
        t[Int(UInt8(ascii: "_"))] = 63
        return t
    }()

    public static func encode(_ bytes: [UInt8], padded: Bool = false) -> String {
        bytes.withUnsafeBufferPointer { encode($0, padded) }
    }

    /// A slice (a JSON `bytes` field) without copying it first.
    public static func encode(_ bytes: ArraySlice<UInt8>, padded: Bool = false) -> String {
        bytes.withUnsafeBufferPointer { encode($0, padded) }
    }

    private static func encode(_ bytes: UnsafeBufferPointer<UInt8>, _ padded: Bool) -> String {
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count + 2) / 3 * 4)
        var i = 0
        while i + 3 <= bytes.count {
            let n = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8 | UInt32(bytes[i + 2])
            out.append(alphabet[Int(n >> 18 & 63)]); out.append(alphabet[Int(n >> 12 & 63)])
            out.append(alphabet[Int(n >> 6 & 63)]); out.append(alphabet[Int(n & 63)])
            i += 3
        }
        let rest = bytes.count - i
        if rest == 1 {
            let n = UInt32(bytes[i]) << 16
            out.append(alphabet[Int(n >> 18 & 63)]); out.append(alphabet[Int(n >> 12 & 63)])
            if padded { out.append(61); out.append(61) }
        } else if rest == 2 {
            let n = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8
            out.append(alphabet[Int(n >> 18 & 63)]); out.append(alphabet[Int(n >> 12 & 63)])
            out.append(alphabet[Int(n >> 6 & 63)])
            if padded { out.append(61) }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Nil when the text is not base64.
    public static func decode(_ s: String) -> [UInt8]? {
        var vals: [UInt8] = []
        vals.reserveCapacity(s.utf8.count)
        var sawPad = false
        for c in s.utf8 {
            if c == 61 { sawPad = true; continue }
            if sawPad { return nil }
            let v = reverse[Int(c)]
            if v < 0 { return nil }
            vals.append(UInt8(v))
        }
        if vals.count % 4 == 1 { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(vals.count * 3 / 4)
        var i = 0
        while i + 4 <= vals.count {
            let n = UInt32(vals[i]) << 18 | UInt32(vals[i + 1]) << 12 | UInt32(vals[i + 2]) << 6 | UInt32(vals[i + 3])
            out.append(UInt8(n >> 16 & 0xFF)); out.append(UInt8(n >> 8 & 0xFF)); out.append(UInt8(n & 0xFF))
            i += 4
        }
        let rest = vals.count - i
        if rest == 2 {
            let n = UInt32(vals[i]) << 18 | UInt32(vals[i + 1]) << 12
            out.append(UInt8(n >> 16 & 0xFF))
        } else if rest == 3 {
            let n = UInt32(vals[i]) << 18 | UInt32(vals[i + 1]) << 12 | UInt32(vals[i + 2]) << 6
            out.append(UInt8(n >> 16 & 0xFF)); out.append(UInt8(n >> 8 & 0xFF))
        }
        return out
    }
}
