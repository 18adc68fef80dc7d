/// Base64url without padding (RFC 4648 §5), as JWTs and our tokens use it.
///
/// Hand-written rather than through Foundation: the gateway decodes three segments of a token on
/// every request, and decoding is strict — no padding, no whitespace, no non-canonical trailing
/// bits — so one token has exactly one spelling.
public enum Base64URL {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)
    private static let reverse: [UInt8] = {
        var table = [UInt8](repeating: 0xFF, count: 256)
        for (i, c) in alphabet.enumerated() { table[Int(c)] = UInt8(i) }
        return table
    }()

    public static func encode(_ bytes: some Collection<UInt8>) -> String {
        let input = Array(bytes)
        var out = [UInt8]()
        out.reserveCapacity((input.count * 4 + 2) / 3)
        var i = 0
        while i + 3 <= input.count {
            let v = UInt32(input[i]) << 16 | UInt32(input[i + 1]) << 8 | UInt32(input[i + 2])
            out.append(alphabet[Int(v >> 18 & 63)])
            out.append(alphabet[Int(v >> 12 & 63)])
            out.append(alphabet[Int(v >> 6 & 63)])
            out.append(alphabet[Int(v & 63)])
            i += 3
        }
        let rest = input.count - i
        if rest == 1 {
            let v = UInt32(input[i]) << 16
            out.append(alphabet[Int(v >> 18 & 63)])
            out.append(alphabet[Int(v >> 12 & 63)])
        } else if rest == 2 {
            let v = UInt32(input[i]) << 16 | UInt32(input[i + 1]) << 8
            out.append(alphabet[Int(v >> 18 & 63)])
            out.append(alphabet[Int(v >> 12 & 63)])
            out.append(alphabet[Int(v >> 6 & 63)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The bytes, or nil if `text` is not canonical unpadded base64url.
    public static func decode(_ text: some StringProtocol) -> [UInt8]? {
        var text = String(text)
        return text.withUTF8 { decode(utf8: $0) }
    }

    /// Decodes from UTF-8 bytes (a slice of a token, without copying it into a String first).
    public static func decode(utf8 input: UnsafeBufferPointer<UInt8>) -> [UInt8]? {
        let n = input.count
        if n % 4 == 1 { return nil }
        var out = [UInt8]()
        out.reserveCapacity(n * 3 / 4)
        var i = 0
        while i + 4 <= n {
            let a = reverse[Int(input[i])], b = reverse[Int(input[i + 1])]
            let c = reverse[Int(input[i + 2])], d = reverse[Int(input[i + 3])]
            if (a | b | c | d) & 0xC0 != 0 { return nil }
            let v = UInt32(a) << 18 | UInt32(b) << 12 | UInt32(c) << 6 | UInt32(d)
            out.append(UInt8(v >> 16 & 0xFF))
            out.append(UInt8(v >> 8 & 0xFF))
            out.append(UInt8(v & 0xFF))
            i += 4
        }
        let rest = n - i
        if rest == 2 {
            let a = reverse[Int(input[i])], b = reverse[Int(input[i + 1])]
            if (a | b) & 0xC0 != 0 || b & 0x0F != 0 { return nil }
            out.append(a << 2 | b >> 4)
        } else if rest == 3 {
            let a = reverse[Int(input[i])], b = reverse[Int(input[i + 1])], c = reverse[Int(input[i + 2])]
            if (a | b | c) & 0xC0 != 0 || c & 0x03 != 0 { return nil }
            out.append(a << 2 | b >> 4)
            out.append((b & 0x0F) << 4 | c >> 2)
        }
        return out
    }
}
