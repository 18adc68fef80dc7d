import Contracts
import Foundation
import Security
import ServiceKit

/// One mail as accounts sends it, and its RFC 5322 form. The machine-readable parts (id, kind,
/// data map) travel in `X-Mail-*` headers so ListSentMail can read a Maildir back without parsing
/// bodies; a mail client shows the usual headers and the plain-text body.
struct MailMessage: Sendable, Equatable {
    var mailID: String
    var kind: Accounts_V1_MailKind
    var from: String
    var to: String
    var subject: String
    var body: String
    var data: [String: String]
    var createdAt: Int64

    init(
        mailID: String, kind: Accounts_V1_MailKind, from: String, to: String, subject: String, body: String,
        data: [String: String], createdAt: Int64
    ) {
        (self.mailID, self.kind, self.from, self.to) = (mailID, kind, from, to)
        (self.subject, self.body, self.data, self.createdAt) = (subject, body, data, createdAt)
    }

    // MARK: Writing

    /// The message with CRLF line ends. Non-ASCII subjects are RFC 2047 encoded words; a body that
    /// is not short-lined ASCII is base64 (RFC 2045), so the file is valid 7-bit RFC 5322.
    func rfc5322(hostname: String) -> [UInt8] {
        var lines: [String] = []
        lines.append("Date: \(Self.rfc5322Date(createdAt))")
        lines.append("From: \(Self.headerSafe(from))")
        lines.append("To: \(Self.headerSafe(to))")
        lines.append("Subject: \(Self.encodedWord(subject))")
        lines.append("Message-ID: <\(mailID)@\(hostname)>")
        lines.append("MIME-Version: 1.0")
        lines.append("Content-Type: text/plain; charset=utf-8")
        lines.append("X-Mail-Id: \(mailID)")
        lines.append("X-Mail-Kind: \(kind.protoName ?? "MAIL_KIND_UNSPECIFIED")")
        lines.append("X-Mail-Created: \(createdAt)")
        for key in data.keys.sorted() {
            lines.append("X-Mail-Data: \(Base64URL.encode(Array(key.utf8))) \(Base64URL.encode(Array(data[key]!.utf8)))")
        }
        let normalized = body.replacingOccurrences(of: "\r\n", with: "\n").replacingOccurrences(of: "\r", with: "\n")
        let bodyLines = normalized.split(separator: "\n", omittingEmptySubsequences: false)
        let plain = normalized.utf8.allSatisfy { $0 < 0x80 } && bodyLines.allSatisfy { $0.utf8.count <= 900 }
        if plain {
            lines.append("Content-Transfer-Encoding: 7bit")
            lines.append("")
            lines.append(contentsOf: bodyLines.map(String.init))
        } else {
            lines.append("Content-Transfer-Encoding: base64")
            lines.append("")
            let encoded = Data(normalized.utf8).base64EncodedString()
            var i = encoded.startIndex
            while i < encoded.endIndex {
                let j = encoded.index(i, offsetBy: 76, limitedBy: encoded.endIndex) ?? encoded.endIndex
                lines.append(String(encoded[i..<j]))
                i = j
            }
        }
        return Array((lines.joined(separator: "\r\n") + "\r\n").utf8)
    }

    /// Header values never carry line breaks (header injection).
    static func headerSafe(_ s: String) -> String {
        String(s.unicodeScalars.filter { $0 != "\r" && $0 != "\n" }.map(Character.init))
    }

    static func encodedWord(_ s: String) -> String {
        let clean = headerSafe(s)
        if clean.utf8.allSatisfy({ $0 >= 0x20 && $0 < 0x7F }) { return clean }
        return "=?UTF-8?B?\(Data(clean.utf8).base64EncodedString())?="
    }

    static func rfc5322Date(_ ms: Int64) -> String {
        let f = DateFormatter()
        f.locale = Locale(identifier: "en_US_POSIX")
        f.timeZone = TimeZone(identifier: "UTC")
        f.dateFormat = "EEE, dd MMM yyyy HH:mm:ss '+0000'"
        return f.string(from: Date(timeIntervalSince1970: Double(ms) / 1000))
    }

    // MARK: Reading

    /// Parses a file this type wrote (or one a mail client moved to `cur/`). Nil for anything else.
    init?(rfc5322 bytes: [UInt8]) {
        let text = String(decoding: bytes, as: UTF8.self).replacingOccurrences(of: "\r\n", with: "\n")
        guard let split = text.range(of: "\n\n") else { return nil }
        var headers: [(String, String)] = []
        for line in text[..<split.lowerBound].split(separator: "\n") {
            if let first = line.first, first == " " || first == "\t", let last = headers.popLast() {
                headers.append((last.0, last.1 + " " + line.trimmingCharacters(in: .whitespaces)))
                continue
            }
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers.append((line[..<colon].lowercased(), line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)))
        }
        func header(_ name: String) -> String? { headers.first { $0.0 == name }?.1 }
        guard let id = header("x-mail-id"), let created = header("x-mail-created").flatMap({ Int64($0) }) else { return nil }
        mailID = id
        kind = header("x-mail-kind").flatMap { Accounts_V1_MailKind(protoName: $0) } ?? .unspecified
        from = header("from") ?? ""
        to = header("to") ?? ""
        subject = Self.decodeEncodedWord(header("subject") ?? "")
        createdAt = created
        var data: [String: String] = [:]
        for (name, value) in headers where name == "x-mail-data" {
            let parts = value.split(separator: " ")
            guard parts.count == 2, let k = Base64URL.decode(parts[0]), let v = Base64URL.decode(parts[1]) else { continue }
            data[String(decoding: k, as: UTF8.self)] = String(decoding: v, as: UTF8.self)
        }
        self.data = data
        let rawBody = String(text[split.upperBound...])
        if header("content-transfer-encoding")?.lowercased() == "base64" {
            let joined = rawBody.split(separator: "\n").joined()
            body = Data(base64Encoded: joined).map { String(decoding: $0, as: UTF8.self) } ?? ""
        } else {
            body = rawBody.hasSuffix("\n") ? String(rawBody.dropLast()) : rawBody
        }
    }

    static func decodeEncodedWord(_ s: String) -> String {
        guard s.hasPrefix("=?UTF-8?B?"), s.hasSuffix("?="), s.count > 12 else { return s }
        let inner = s.dropFirst(10).dropLast(2)
        return Data(base64Encoded: String(inner)).map { String(decoding: $0, as: UTF8.self) } ?? s
    }

    var proto: Accounts_V1_Mail {
        var m = Accounts_V1_Mail()
        m.mailId = mailID
        m.kind = kind
        m.toEmail = to
        m.subject = subject
        m.bodyText = body
        m.data = data
        m.createdAt = Google_Protobuf_Timestamp(milliseconds: createdAt)
        return m
    }
}

extension Accounts_V1_MailKind {
    init?(protoName: String) {
        guard let k = Self.allCases.first(where: { $0.protoName == protoName }) else { return nil }
        self = k
    }
}
