import Accounts
import Contracts
import Foundation
import RPCCore
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("AccountsInternal: lookups and the mail outbox")
struct InternalAPITests {
    @Test func lookupsByIdUsernameAndEmail() async throws {
        try await withAccounts { env in
            let bob = try await env.signUp(uniqueName("Bob_K"), displayName: "Bob Kowalski").user
            let carol = try await env.signUp(uniqueName("carol.w"), email: "Carol.\(UUID().uuidString.prefix(6))@Example.com").user
            let guest = try await env.accounts.createGuest(Accounts_V1_CreateGuestRequest()).user
            let missing = "01JD3KCW8S4B1C5D9E2F6G7H8J"

            var ids = Accounts_V1_GetUsersByIdsRequest()
            ids.userIds = [bob.userId, missing, guest.userId, bob.userId]
            let byID = try await env.internalAPI.getUsersByIds(ids)
            #expect(byID.usersById[bob.userId]?.username == bob.username)
            #expect(byID.usersById[bob.userId]?.displayName == "Bob Kowalski")
            #expect(byID.usersById[guest.userId]?.userId == guest.userId)  // guests included
            #expect(byID.unknownUserIds == [missing])

            var names = Accounts_V1_ResolveUsernamesRequest()
            names.usernames = [bob.username.uppercased(), carol.username, "zed", "zed"]
            let byName = try await env.internalAPI.resolveUsernames(names)
            #expect(byName.usersByUsername[bob.username.uppercased()]?.userId == bob.userId)
            #expect(byName.usersByUsername[carol.username]?.userId == carol.userId)
            #expect(byName.unknownUsernames == ["zed"])

            var emails = Accounts_V1_ResolveEmailsRequest()
            emails.emails = [carol.email.lowercased(), "newcomer@example.org"]
            let byEmail = try await env.internalAPI.resolveEmails(emails)
            #expect(byEmail.usersByEmail[carol.email.lowercased()]?.userId == carol.userId)
            #expect(byEmail.unknownEmails == ["newcomer@example.org"])

            await expectFailure(.invalidArgument, fields: ["user_ids"]) {
                try await env.internalAPI.getUsersByIds(Accounts_V1_GetUsersByIdsRequest())
            }
            ids.userIds = (0..<201).map { "id\($0)" }
            await expectFailure(.invalidArgument, fields: ["user_ids"]) { try await env.internalAPI.getUsersByIds(ids) }
            await expectFailure(.invalidArgument, fields: ["usernames"]) {
                try await env.internalAPI.resolveUsernames(Accounts_V1_ResolveUsernamesRequest())
            }
            await expectFailure(.invalidArgument, fields: ["emails"]) { try await env.internalAPI.resolveEmails(Accounts_V1_ResolveEmailsRequest()) }
            // Without the service credential: refused, whatever the caller has.
            await expectFailure(.permissionDenied) { try await Accounts_V1_AccountsInternalClient(env.channel.client).getUsersByIds(ids) }
        }
    }

    static func invite(
        _ event: String, to: String = "newcomer@example.org",
        body: String = "Hi! Alice invited you.\nEnter the code K7P2-9XQM.\n.\nSee you — Zoë"
    ) -> Accounts_V1_SendMailRequest {
        var r = Accounts_V1_SendMailRequest()
        r.eventId = event
        r.kind = .householdInvite
        r.toEmail = to
        r.subject = "Alice Martin invited you to Maple Street 12 on ChoreMate"
        r.bodyText = body
        r.data = ["invite_code": "K7P2-9XQM", "household_id": "01JD4H2M3N4P5Q6R7S8T9V0W1X"]
        return r
    }

    @Test func sendMailIsIdempotentByEventIDAndListSentMailReadsItBack() async throws {
        try await withAccounts { env in
            let first = try await env.internalAPI.sendMail(Self.invite("social:evt-1"))
            #expect(!first.replayed && first.mailId.count == 26)
            let again = try await env.internalAPI.sendMail(Self.invite("social:evt-1"))
            #expect(again.replayed && again.mailId == first.mailId)
            for i in 2...5 { _ = try await env.internalAPI.sendMail(Self.invite("social:evt-\(i)", to: "other@example.org")) }

            var list = Accounts_V1_ListSentMailRequest()
            list.toEmail = "NEWCOMER@example.org"
            let mine = try await env.internalAPI.listSentMail(list).mails
            #expect(mine.count == 1)
            let mail = try #require(mine.first)
            #expect(mail.mailId == first.mailId && mail.kind == .householdInvite && mail.toEmail == "newcomer@example.org")
            #expect(mail.subject == Self.invite("x").subject)
            #expect(mail.bodyText == Self.invite("x").bodyText)  // non-ASCII, dot lines: round-trips
            #expect(mail.data == Self.invite("x").data)

            // Newest first, two per page, no repeats; tokens bound to the filters.
            list = Accounts_V1_ListSentMailRequest()
            list.pageSize = 2
            var seen: [String] = []
            repeat {
                let page = try await env.internalAPI.listSentMail(list)
                seen += page.mails.map(\.mailId)
                list.pageToken = page.nextPageToken
            } while !list.pageToken.isEmpty
            #expect(seen.count == 5 && seen == seen.sorted(by: >) && Set(seen).count == 5)
            list.pageToken = try await env.internalAPI.listSentMail(
                {
                    var r = Accounts_V1_ListSentMailRequest(); r.pageSize = 2; return r
                }()
            ).nextPageToken
            list.kind = .passwordReset
            await expectFailure(.invalidArgument, fields: ["page_token"]) { try await env.internalAPI.listSentMail(list) }
            list = Accounts_V1_ListSentMailRequest()
            list.kind = .passwordReset
            #expect(try await env.internalAPI.listSentMail(list).mails.isEmpty)
            list.pageSize = -3
            await expectFailure(.invalidArgument, fields: ["page_size"]) { try await env.internalAPI.listSentMail(list) }

            var bad = Accounts_V1_SendMailRequest()
            bad.data = ["": "x"]
            await expectFailure(.invalidArgument, fields: ["event_id", "kind", "to_email", "subject", "body_text", "data"]) {
                try await env.internalAPI.sendMail(bad)
            }
        }
    }

    @Test func mailGoesToAnSMTPRelayWhenConfigured() async throws {
        let relay = try FakeSMTPServer()
        defer { relay.stop() }
        try await withAccounts({ $0.mail = .smtp(host: "127.0.0.1", port: relay.port, helo: "accounts.test") }) { env in
            let r = try await env.internalAPI.sendMail(Self.invite("social:smtp-1", body: "Enter the code.\n.\nBye"))
            let deadline = ContinuousClock.now + .seconds(10)
            while relay.sessions.isEmpty && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(20)) }
            let session = try #require(relay.sessions.first)
            #expect(session.contains("EHLO accounts.test"))
            #expect(session.contains("MAIL FROM:<no-reply@accounts.invalid>"))
            #expect(session.contains("RCPT TO:<newcomer@example.org>"))
            #expect(session.contains("X-Mail-Id: \(r.mailId)"))
            #expect(session.contains("\r\n..\r\n"))  // the body's "." line, dot-stuffed
            #expect(session.hasSuffix("QUIT\r\n"))
            // Password resets go there too; nothing is kept locally.
            let user = try await env.signUp().user
            var reset = Accounts_V1_RequestPasswordResetRequest()
            reset.email = user.email
            _ = try await env.accounts.requestPasswordReset(reset)
            while relay.sessions.count < 2 && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(20)) }
            #expect(relay.sessions.count == 2)
            #expect(relay.sessions.last?.contains("RCPT TO:<\(user.email)>") == true)
            #expect(try await env.internalAPI.listSentMail(Accounts_V1_ListSentMailRequest()).mails.isEmpty)
        }
    }

    @Test func anUnreachableRelayIsUnavailableSoTheSenderRetries() async throws {
        let port = try await DeletionTests.unusedPort()
        try await withAccounts({ $0.mail = .smtp(host: "127.0.0.1", port: port, helo: "accounts.test") }) { env in
            await expectFailure(.unavailable) { try await env.internalAPI.sendMail(Self.invite("social:down-1")) }
        }
    }
}

/// A minimal SMTP relay on 127.0.0.1: accepts every mail and records each conversation.
final class FakeSMTPServer: @unchecked Sendable {
    let port: Int
    private let fd: Int32
    private let recorded = Mutex<[String]>([])
    var sessions: [String] { recorded.withLock { $0 } }

    init() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        self.fd = fd
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        addr.sin_port = 0
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ok = withUnsafeMutablePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { sa in
                bind(fd, sa, len) == 0 && listen(fd, 8) == 0 && getsockname(fd, sa, &len) == 0
            }
        }
        guard ok else {
            close(fd)
            throw RPCError(.internal, "fake SMTP: cannot listen")
        }
        port = Int(UInt16(bigEndian: addr.sin_port))
        let thread = Thread { [self] in self.serve() }
        thread.start()
    }

    func stop() { shutdown(fd, Int32(SHUT_RDWR)); close(fd) }

    private func serve() {
        while true {
            let c = accept(fd, nil, nil)
            guard c >= 0 else { return }
            var transcript = ""
            func say(_ s: String) { _ = s.withCString { send(c, $0, strlen($0), Int32(MSG_NOSIGNAL)) } }
            say("220 fake ESMTP\r\n")
            var buffer = ""
            var inData = false
            loop: while true {
                var chunk = [UInt8](repeating: 0, count: 4096)
                let n = recv(c, &chunk, chunk.count, 0)
                if n <= 0 { break }
                let text = String(decoding: chunk[..<n], as: UTF8.self)
                transcript += text
                buffer += text
                while true {
                    if inData {
                        guard let end = buffer.range(of: "\r\n.\r\n") else { break }
                        buffer = String(buffer[end.upperBound...])
                        inData = false
                        say("250 queued\r\n")
                        continue
                    }
                    guard let nl = buffer.range(of: "\r\n") else { break }
                    let line = String(buffer[..<nl.lowerBound])
                    buffer = String(buffer[nl.upperBound...])
                    if line.hasPrefix("EHLO") {
                        say("250-fake\r\n250 8BITMIME\r\n")
                    } else if line.hasPrefix("DATA") {
                        say("354 go ahead\r\n"); inData = true
                    } else if line.hasPrefix("QUIT") {
                        say("221 bye\r\n"); break loop
                    } else {
                        say("250 ok\r\n")
                    }
                }
            }
            close(c)
            recorded.withLock { $0.append(transcript) }
        }
    }
}
