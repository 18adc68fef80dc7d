import Security

/// Opaque page tokens: the cursor (the last item's sort key) and a fingerprint of the request's
/// filters, MACed with a server secret so a token cannot be forged or reused with other filters
/// (both → INVALID_ARGUMENT naming `page_token`, as Proto/README.md asks).
struct PageTokens: Sendable {
    let key: [UInt8]

    /// `base64url(cursor parts joined by NUL) . base64url(first 16 bytes of HMAC)`.
    func make(cursor: [String], filters: String) -> String {
        let body = Array(cursor.joined(separator: "\u{0}").utf8)
        return Base64URL.encode(body) + "." + Base64URL.encode(mac(body, filters))
    }

    /// The cursor of a token made for the same filters; nil for a forged or foreign token.
    func open(_ token: String, filters: String, parts: Int) -> [String]? {
        let pieces = token.split(separator: ".", omittingEmptySubsequences: false)
        guard pieces.count == 2, let body = Base64URL.decode(pieces[0]), let tag = Base64URL.decode(pieces[1]),
              ConstantTime.equals(tag, mac(body, filters))
        else { return nil }
        let cursor = String(decoding: body, as: UTF8.self).split(separator: "\u{0}", omittingEmptySubsequences: false).map(String.init)
        return cursor.count == parts ? cursor : nil
    }

    private func mac(_ body: [UInt8], _ filters: String) -> [UInt8] {
        Array(HMACSHA256.authenticationCode(for: body + [0] + Array(filters.utf8), key: key).prefix(16))
    }
}
