import Foundation
import Security
import ServiceKit

/// Team-task rules that need no storage: field limits, the tokens' shapes, what an attachment
/// may be. Unit-tested on their own.
public enum TeamTaskRules {
    public static let nameLength = 1...100
    public static let descriptionLength = 0...2000
    public static let commentLength = 1...1000
    public static let helpMessageLength = 0...200
    public static let maxOtherParticipants = 49
    public static let maxUsernameLength = 64

    // MARK: Public link tokens

    /// 43 characters of base64url: 32 random bytes (unguessable).
    public static func newLinkToken() -> String { Base64URL.encode(SecureRandom.bytes(32)) }

    /// The shape of a link token (checked before any lookup).
    public static func isLinkToken(_ s: String) -> Bool {
        s.utf8.count == 43
            && s.utf8.allSatisfy { c in
                (0x41...0x5A).contains(c) || (0x61...0x7A).contains(c) || (0x30...0x39).contains(c) || c == 0x2D || c == 0x5F
            }
    }

    // MARK: Upload tokens

    static let crockford = Array("0123456789ABCDEFGHJKMNPQRSTVWXYZ")

    /// A token a person can type: 9 Crockford base32 characters (45 random bits) shown as
    /// "XXXX-XXXXX" (10 characters with the dash).
    public static func newUploadToken() -> String {
        let bytes = SecureRandom.bytes(9)
        let chars = bytes.map { crockford[Int($0 & 31)] }
        return String(chars[0..<4]) + "-" + String(chars[4..<9])
    }

    /// The canonical form of a typed token: case-insensitive, dashes and spaces ignored, and the
    /// letters Crockford base32 reads as digits (O → 0, I and L → 1). nil when it cannot be a
    /// token (wrong length or a character outside the alphabet).
    public static func normalizeUploadToken(_ typed: String) -> String? {
        var out: [Character] = []
        for c in typed.uppercased() {
            switch c {
            case "-", " ", "\t": continue
            case "O": out.append("0")
            case "I", "L": out.append("1")
            default:
                guard crockford.contains(c) else { return nil }
                out.append(c)
            }
            if out.count > 9 { return nil }
        }
        return out.count == 9 ? String(out) : nil
    }

    /// What is stored for a token: SHA-256 of its canonical form.
    public static func uploadTokenHash(_ normalized: String) -> [UInt8] { SHA256.hash(Array(("upload:" + normalized).utf8)) }

    // MARK: Attachments

    /// The types an attachment may have: documents, images, archives, plain data. Never a type a
    /// browser would run (HTML, SVG, JavaScript, XML with scripts).
    public static let allowedContentTypes: Set<String> = [
        "application/pdf", "image/png", "image/jpeg", "image/gif", "image/webp", "image/heic", "text/plain", "text/csv",
        "text/markdown", "application/json", "application/zip", "application/octet-stream", "application/msword",
        "application/vnd.ms-excel", "application/vnd.ms-powerpoint", "application/rtf",
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        "application/vnd.openxmlformats-officedocument.presentationml.presentation",
        "application/vnd.oasis.opendocument.text", "application/vnd.oasis.opendocument.spreadsheet",
        "application/vnd.oasis.opendocument.presentation", "audio/mpeg", "audio/mp4", "video/mp4",
    ]

    /// Types whose first bytes are known: the data must start with them.
    static let signatures: [String: [[UInt8]]] = [
        "application/pdf": [Array("%PDF-".utf8)],
        "image/png": [[0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]],
        "image/jpeg": [[0xFF, 0xD8, 0xFF]],
        "image/gif": [Array("GIF87a".utf8), Array("GIF89a".utf8)],
        "application/zip": [[0x50, 0x4B, 0x03, 0x04], [0x50, 0x4B, 0x05, 0x06]],
    ]

    /// Why a value is refused.
    public struct Problem: Error, Equatable, Sendable {
        public var text: String
        public init(_ text: String) { self.text = text }
    }

    /// Normalises a content type ("" → application/octet-stream; parameters dropped, lower case)
    /// and checks it against the allowed types and, where they are known, the data's first bytes.
    /// Returns the type to store, or why not.
    public static func contentType(_ raw: String, data: [UInt8]) -> Result<String, Problem> {
        let t = FieldRules.trimmed(raw)
        if FieldRules.length(t) > 100 { return .failure(Problem("must be at most 100 characters")) }
        let media = (t.split(separator: ";").first.map(String.init) ?? "").trimmingCharacters(in: .whitespaces).lowercased()
        let type = media.isEmpty ? "application/octet-stream" : media
        let parts = type.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 2, !parts[0].isEmpty, !parts[1].isEmpty else { return .failure(Problem("must be a MIME type \"type/subtype\"")) }
        guard allowedContentTypes.contains(type) else {
            return .failure(Problem("\(type) files are not accepted (allowed: PDF, images, text, CSV, office documents, ZIP, audio, video)"))
        }
        if type == "image/webp", !(data.count >= 12 && Array(data[0..<4]) == Array("RIFF".utf8) && Array(data[8..<12]) == Array("WEBP".utf8)) {
            return .failure(Problem("the file is not a WEBP image"))
        }
        if let sigs = signatures[type], !sigs.contains(where: { data.starts(with: $0) }) {
            return .failure(Problem("the file's content is not \(type)"))
        }
        return .success(type)
    }

    /// A file name as the contract allows it: 1..255 characters, no "/" or "\" or control
    /// characters. Returns the problem, or nil.
    public static func filenameProblem(_ name: String) -> String? {
        let n = FieldRules.length(name)
        if n == 0 { return "required" }
        if n > 255 { return "must be at most 255 characters" }
        if name.contains("/") || name.contains("\\") { return "must not contain path separators (/ or \\)" }
        if FieldRules.hasControlCharacters(name) { return "must not contain control characters" }
        if name == "." || name == ".." { return "is not a file name" }
        return nil
    }

    /// Lower-case hex.
    public static func hex(_ bytes: [UInt8]) -> String { HashChain.hex(bytes) }
}
