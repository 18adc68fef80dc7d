import Dispatch
import Foundation
import ServiceKit

#if canImport(Glibc)
import Glibc
#endif

/// Where accounts' mails go: password resets, and what other services send through SendMail.
protocol MailSink: Sendable {
    /// Hands the mail over for good (written and synced, or accepted by the relay), or throws.
    func deliver(_ mail: MailMessage) async throws
    /// Mails that can be read back (ListSentMail), in no particular order; empty when the sink
    /// cannot read back (SMTP).
    func readBack() async throws -> [MailMessage]
    /// Whether a mail with this id was delivered already (a SendMail retry after a crash).
    func contains(mailID: String) async -> Bool
}

/// Runs blocking file and socket work on one thread of its own, never on an event loop or the
/// cooperative pool. Mail is rare: one serial queue is plenty.
enum MailIO {
    /// Mail files and SMTP sockets block: one thread of the kit's bounded pool, so a stuck relay
    /// or a slow disk sheds calls (UNAVAILABLE) instead of queueing them without bound.
    static let pool = BlockingPool(name: "mail I/O", threads: 1, maxQueued: 256)

    static func run<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await pool.run(body)
    }
}

struct MailError: Error, CustomStringConvertible {
    let description: String
    init(_ d: String) { description = d }
}

/// A Maildir (`tmp/`, `new/`, `cur/`): each mail a file written into `tmp/`, synced, then renamed
/// into `new/` — the Maildir delivery protocol, so a reader (a mail client, ListSentMail) never sees
/// half a mail. Files are 0600: they hold reset tokens and invite codes.
struct MaildirSink: MailSink {
    let path: String
    let hostname: String

    init(path: String) throws {
        self.path = path
        self.hostname = ProcessInfo.processInfo.hostName.replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: ":", with: "_")
        for sub in ["tmp", "new", "cur"] {
            try FileManager.default.createDirectory(
                atPath: "\(path)/\(sub)", withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        }
    }

    /// `<seconds>.<mail id>.<host>`: unique (ULIDs are), and the id is findable by name.
    func fileName(_ mail: MailMessage) -> String { "\(mail.createdAt / 1000).\(mail.mailID).\(hostname)" }

    func deliver(_ mail: MailMessage) async throws {
        let bytes = mail.rfc5322(hostname: hostname)
        let name = fileName(mail)
        let path = self.path
        try await MailIO.run {
            let tmp = "\(path)/tmp/\(name)"
            let fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
            guard fd >= 0 else { throw MailError("cannot create \(tmp): \(String(cString: strerror(errno)))") }
            let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            let synced = fsync(fd)
            close(fd)
            guard written == bytes.count, synced == 0, rename(tmp, "\(path)/new/\(name)") == 0 else {
                let reason = String(cString: strerror(errno))
                unlink(tmp)
                throw MailError("cannot write mail into \(path): \(reason)")
            }
            // The rename is durable once the directory is synced.
            let dir = open("\(path)/new", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            if dir >= 0 {
                fsync(dir)
                close(dir)
            }
        }
    }

    func readBack() async throws -> [MailMessage] {
        let path = self.path
        return try await MailIO.run {
            var mails: [MailMessage] = []
            for sub in ["new", "cur"] {
                let dir = "\(path)/\(sub)"
                for name in (try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? [] where !name.hasPrefix(".") {
                    guard let data = FileManager.default.contents(atPath: "\(dir)/\(name)"), data.count <= 1 << 20,
                        let mail = MailMessage(rfc5322: [UInt8](data))
                    else { continue }
                    mails.append(mail)
                }
            }
            return mails
        }
    }

    func contains(mailID: String) async -> Bool {
        let path = self.path
        return
            (try? await MailIO.run {
                for sub in ["new", "cur"] {
                    let names = (try? FileManager.default.contentsOfDirectory(atPath: "\(path)/\(sub)")) ?? []
                    if names.contains(where: { $0.split(separator: ".").dropFirst().first.map(String.init) == mailID }) { return true }
                }
                return false
            }) ?? false
    }
}

/// Plain SMTP (RFC 5321) to a relay: EHLO, MAIL FROM, RCPT TO, DATA, QUIT over one TCP connection
/// per mail. No STARTTLS and no AUTH: point it at a local relay (a sidecar or the host's MTA) that
/// does those. Nothing is kept locally, so ListSentMail lists nothing in this mode.
struct SMTPSink: MailSink {
    let host: String
    let port: Int
    let helo: String
    var timeoutSeconds = 10

    func deliver(_ mail: MailMessage) async throws {
        let message = mail.rfc5322(hostname: helo)
        let (host, port, helo, timeout) = (self.host, self.port, self.helo, timeoutSeconds)
        try await MailIO.run {
            let connection = try SMTPConnection(host: host, port: port, timeoutSeconds: timeout)
            defer { connection.close() }
            try connection.expect(220)
            try connection.command("EHLO \(helo)", expect: 250)
            try connection.command("MAIL FROM:<\(Self.address(mail.from))>", expect: 250)
            try connection.command("RCPT TO:<\(Self.address(mail.to))>", expect: 250, 251)
            try connection.command("DATA", expect: 354)
            try connection.send(Self.dotStuffed(message) + Array(".\r\n".utf8))
            try connection.expect(250)
            try? connection.command("QUIT", expect: 221)
        }
    }

    func readBack() async throws -> [MailMessage] { [] }
    func contains(mailID: String) async -> Bool { false }

    /// The bare address of `Name <addr>` (or the whole string), without line breaks or brackets.
    static func address(_ s: String) -> String {
        var a = s
        if let open = s.lastIndex(of: "<"), let close = s.lastIndex(of: ">"), open < close {
            a = String(s[s.index(after: open)..<close])
        }
        return String(a.unicodeScalars.filter { !"\r\n<> ".unicodeScalars.contains($0) }.map(Character.init))
    }

    /// RFC 5321 §4.5.2: a line starting with "." gets another one.
    static func dotStuffed(_ message: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(message.count + 16)
        var atLineStart = true
        for b in message {
            if atLineStart && b == UInt8(ascii: ".") { out.append(b) }
            out.append(b)
            atLineStart = b == UInt8(ascii: "\n")
        }
        return out
    }
}

/// One blocking SMTP conversation over a POSIX socket (on the mail I/O thread).
final class SMTPConnection {
    private let fd: Int32
    private var buffer: [UInt8] = []

    init(host: String, port: Int, timeoutSeconds: Int) throws {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var result: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, String(port), &hints, &result) == 0, let first = result else {
            throw MailError("SMTP: cannot resolve \(host)")
        }
        defer { freeaddrinfo(result) }
        var info: UnsafeMutablePointer<addrinfo>? = first
        var connected: Int32 = -1
        while let ai = info {
            let s = socket(ai.pointee.ai_family, ai.pointee.ai_socktype, ai.pointee.ai_protocol)
            if s >= 0 {
                var tv = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
                setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
                setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
                if connect(s, ai.pointee.ai_addr, ai.pointee.ai_addrlen) == 0 {
                    connected = s
                    break
                }
                Glibc.close(s)
            }
            info = ai.pointee.ai_next
        }
        guard connected >= 0 else { throw MailError("SMTP: cannot connect to \(host):\(port)") }
        fd = connected
    }

    func close() { Glibc.close(fd) }

    func send(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let n = bytes[offset...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard n > 0 else { throw MailError("SMTP: connection lost while sending") }
            offset += n
        }
    }

    func command(_ line: String, expect codes: Int...) throws {
        try send(Array((line + "\r\n").utf8))
        try expect(codes)
    }

    func expect(_ codes: Int...) throws { try expect(codes) }

    /// Reads one (possibly multi-line) reply and checks its code.
    private func expect(_ codes: [Int]) throws {
        while true {
            let line = try readLine()
            guard line.count >= 3, let code = Int(line.prefix(3)) else { throw MailError("SMTP: malformed reply \(line.prefix(80))") }
            if line.count > 3 && line[line.index(line.startIndex, offsetBy: 3)] == "-" { continue }
            guard codes.contains(code) else { throw MailError("SMTP: server replied \(line.prefix(200))") }
            return
        }
    }

    private func readLine() throws -> String {
        while true {
            if let nl = buffer.firstIndex(of: UInt8(ascii: "\n")) {
                var line = Array(buffer[..<nl])
                buffer.removeFirst(nl + 1)
                if line.last == UInt8(ascii: "\r") { line.removeLast() }
                return String(decoding: line, as: UTF8.self)
            }
            guard buffer.count < 64 * 1024 else { throw MailError("SMTP: reply line too long") }
            var chunk = [UInt8](repeating: 0, count: 4096)
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard n > 0 else { throw MailError("SMTP: connection closed or timed out") }
            buffer.append(contentsOf: chunk[..<n])
        }
    }
}
