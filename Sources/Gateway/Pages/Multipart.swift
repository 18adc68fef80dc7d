/// `multipart/form-data` (RFC 7578) as browsers send a form: parts separated by a boundary, each
/// with headers naming its field (and, for a file, its file name and type). Parsed in one pass over
/// the body the server has already bounded; anything malformed is refused, never guessed at.
public enum Multipart {
    public struct Part: Sendable, Equatable {
        public var name: String
        /// Set for a file input (possibly empty: a file input with nothing chosen).
        public var filename: String?
        public var contentType: String?
        public var body: [UInt8]
    }

    public enum Failure: Error, Equatable, Sendable {
        case notMultipart
        case noBoundary
        case malformed(String)
    }

    /// The boundary of a `content-type` header value, if it is multipart/form-data.
    public static func boundary(contentType: String) throws(Failure) -> String {
        let parts = contentType.split(separator: ";").map { $0.strip(" \t") }
        guard parts.first?.lowercased() == "multipart/form-data" else { throw .notMultipart }
        for p in parts.dropFirst() {
            let kv = p.split(separator: "=", maxSplits: 1).map(String.init)
            guard kv.count == 2, kv[0].lowercased() == "boundary" else { continue }
            var b = kv[1]
            if b.hasPrefix("\""), b.hasSuffix("\""), b.count >= 2 { b = String(b.dropFirst().dropLast()) }
            guard (1...70).contains(b.utf8.count) else { throw .noBoundary }
            return b
        }
        throw .noBoundary
    }

    /// The parts of `body`, in order. At most `maxParts`.
    public static func parse(_ body: [UInt8], boundary: String, maxParts: Int = 16) throws(Failure) -> [Part] {
        let dash = Array(("--" + boundary).utf8)
        let delimiter = Array(("\r\n--" + boundary).utf8)
        guard let start = find(dash, in: body, from: 0) else { throw .malformed("no boundary in the body") }
        var at = start + dash.count
        var parts: [Part] = []
        while true {
            // After a boundary: "--" ends the body, CRLF starts a part.
            if body.count - at >= 2, body[at] == 0x2D, body[at + 1] == 0x2D { return parts }
            guard body.count - at >= 2, body[at] == 0x0D, body[at + 1] == 0x0A else { throw .malformed("bad boundary line") }
            at += 2
            guard let headerEnd = find([0x0D, 0x0A, 0x0D, 0x0A], in: body, from: at) else { throw .malformed("part without headers") }
            guard headerEnd - at <= 8192 else { throw .malformed("part headers too long") }
            let headerText = String(decoding: body[at..<headerEnd], as: UTF8.self)
            let contentStart = headerEnd + 4
            guard let end = find(delimiter, in: body, from: contentStart) else { throw .malformed("part not terminated") }
            var part = Part(name: "", filename: nil, contentType: nil, body: Array(body[contentStart..<end]))
            var named = false
            for line in headerText.split(separator: "\r\n") {
                let kv = line.split(separator: ":", maxSplits: 1)
                guard kv.count == 2 else { continue }
                let key = kv[0].strip(" \t").lowercased(), value = kv[1].strip(" \t")
                if key == "content-disposition" {
                    let params = dispositionParameters(value)
                    guard let name = params["name"] else { throw .malformed("part without a name") }
                    part.name = name
                    part.filename = params["filename"]
                    named = true
                } else if key == "content-type" {
                    part.contentType = value
                }
            }
            guard named else { throw .malformed("part without Content-Disposition") }
            parts.append(part)
            guard parts.count <= maxParts else { throw .malformed("too many parts") }
            at = end + delimiter.count
        }
    }

    /// `form-data; name="file"; filename="a \"b\".pdf"` → ["name": "file", "filename": "a \"b\".pdf"].
    /// Quoted strings may escape `"` and `\` with a backslash (what browsers send).
    static func dispositionParameters(_ value: String) -> [String: String] {
        var out: [String: String] = [:]
        let s = Array(value.unicodeScalars)
        var i = 0
        // Skip the disposition type.
        while i < s.count, s[i] != ";" { i += 1 }
        while i < s.count {
            i += 1  // ";"
            while i < s.count, s[i] == " " || s[i] == "\t" { i += 1 }
            var key = ""
            while i < s.count, s[i] != "=", s[i] != ";" {
                key.unicodeScalars.append(s[i])
                i += 1
            }
            guard i < s.count, s[i] == "=" else { continue }
            i += 1
            var v = ""
            if i < s.count, s[i] == "\"" {
                i += 1
                while i < s.count, s[i] != "\"" {
                    if s[i] == "\\", i + 1 < s.count { i += 1 }
                    v.unicodeScalars.append(s[i])
                    i += 1
                }
                i += 1
                while i < s.count, s[i] != ";" { i += 1 }
            } else {
                while i < s.count, s[i] != ";" {
                    v.unicodeScalars.append(s[i])
                    i += 1
                }
                v = v.strip(" \t")
            }
            out[key.strip(" \t").lowercased()] = v
        }
        return out
    }

    /// The first index of `needle` in `hay` at or after `from`.
    static func find(_ needle: [UInt8], in hay: [UInt8], from: Int) -> Int? {
        guard !needle.isEmpty, hay.count >= needle.count, from <= hay.count - needle.count else { return nil }
        let first = needle[0]
        var i = from
        let last = hay.count - needle.count
        return hay.withUnsafeBufferPointer { h in
            needle.withUnsafeBufferPointer { n in
                while i <= last {
                    if h[i] == first {
                        var j = 1
                        while j < n.count, h[i + j] == n[j] { j += 1 }
                        if j == n.count { return i }
                    }
                    i += 1
                }
                return nil
            }
        }
    }
}

extension String {
    func strip(_ set: String) -> String {
        let chars = Set(set.unicodeScalars)
        var sub = Substring(self).unicodeScalars[...]
        while let f = sub.first, chars.contains(f) { sub = sub.dropFirst() }
        while let l = sub.last, chars.contains(l) { sub = sub.dropLast() }
        return String(String.UnicodeScalarView(sub))
    }
}

extension Substring {
    func strip(_ set: String) -> String { String(self).strip(set) }
}
