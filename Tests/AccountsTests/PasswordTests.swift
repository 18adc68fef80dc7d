import Accounts
import Contracts
import Foundation
import RPCCore
import Security
import Storage
import Testing

@Suite("Accounts: change and recover passwords")
struct PasswordTests {
    func change(_ current: String, _ new: String) -> Accounts_V1_ChangePasswordRequest {
        var r = Accounts_V1_ChangePasswordRequest()
        r.currentPassword = current
        r.newPassword = new
        return r
    }

    @Test func changePasswordNeedsTheCurrentOneAndRevokesTheOtherSessions() async throws {
        try await withAccounts { env in
            let name = uniqueName()
            let mine = try await env.signUp(name).session
            let other1 = try await env.logIn(name).session
            let other2 = try await env.logIn(name).session

            await expectFailure(.invalidArgument, fields: ["current_password"]) {
                try await env.accounts.changePassword(change("not the password", "lantern-quartz-meadow-7"), options: bearer(mine))
            }
            await expectFailure(.invalidArgument, fields: ["current_password", "new_password"]) {
                try await env.accounts.changePassword(change("", "short"), options: bearer(mine))
            }
            await expectFailure(.invalidArgument, fields: ["new_password"]) {
                try await env.accounts.changePassword(change("correct horse battery staple", "correct horse battery staple"), options: bearer(mine))
            }
            let r = try await env.accounts.changePassword(change("correct horse battery staple", "lantern-quartz-meadow-7"), options: bearer(mine))
            #expect(r.revokedSessions == 2)
            _ = try await env.accounts.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: bearer(mine))
            _ = try await env.accounts.refreshSession(refresh(mine.refreshToken))
            for s in [other1, other2] {
                await expectFailure(.unauthenticated) { try await env.accounts.refreshSession(refresh(s.refreshToken)) }
                await expectFailure(.unauthenticated) { try await env.accounts.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: bearer(s)) }
            }
            await expectFailure(.unauthenticated) { try await env.logIn(name) }
            _ = try await env.logIn(name, "lantern-quartz-meadow-7")
        }
    }

    @Test func wrongCurrentPasswordsAreThrottledLikeLogins() async throws {
        try await withAccounts({ $0.maxFailuresPerAccount = 2 }) { env in
            let s = try await env.signUp().session
            for _ in 0..<2 {
                await expectFailure(.invalidArgument, fields: ["current_password"]) {
                    try await env.accounts.changePassword(change("guess-guess-1", "lantern-quartz-meadow-7"), options: bearer(s))
                }
            }
            await expectFailure(.resourceExhausted) {
                try await env.accounts.changePassword(change("correct horse battery staple", "lantern-quartz-meadow-7"), options: bearer(s))
            }
        }
    }

    @Test func recoveryMailsASingleUseTokenThatResetsAndRevokesEverything() async throws {
        try await withAccounts { env in
            let name = uniqueName()
            let email = "\(name)@example.com"
            let a = try await env.signUp(name, email: email).session
            let b = try await env.logIn(name).session

            var request = Accounts_V1_RequestPasswordResetRequest()
            request.email = email.uppercased()
            _ = try await env.accounts.requestPasswordReset(request)
            let mails = try await env.waitForMail(to: email)
            let mail = try #require(mails.first)
            #expect(mail.kind == .passwordReset)
            #expect(mail.subject == "Reset your password")
            let token = try #require(mail.data["reset_token"])
            #expect(token.count == 43)
            #expect(mail.bodyText.contains(token) && mail.bodyText.contains(name))

            var reset = Accounts_V1_ResetPasswordRequest()
            reset.resetToken = token
            reset.newPassword = "short"
            await expectFailure(.invalidArgument, fields: ["new_password"]) { try await env.accounts.resetPassword(reset) }
            reset.newPassword = "new-harbour-lights-19"
            let done = try await env.accounts.resetPassword(reset)
            #expect(done.revokedSessions == 2)
            for s in [a, b] {
                await expectFailure(.unauthenticated) { try await env.accounts.refreshSession(refresh(s.refreshToken)) }
                await expectFailure(.unauthenticated) { try await env.accounts.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: bearer(s)) }
            }
            await expectFailure(.unauthenticated) { try await env.logIn(name) }
            _ = try await env.logIn(name, "new-harbour-lights-19")
            // Single use.
            reset.newPassword = "another-password-2"
            await expectFailure(.failedPrecondition, fields: ["reset_token"]) { try await env.accounts.resetPassword(reset) }
            reset.resetToken = SecureRandom.token()
            await expectFailure(.failedPrecondition, fields: ["reset_token"]) { try await env.accounts.resetPassword(reset) }
            reset.resetToken = ""
            await expectFailure(.invalidArgument, fields: ["reset_token"]) { try await env.accounts.resetPassword(reset) }
        }
    }

    @Test func unknownEmailsLookTheSameToTheCaller() async throws {
        try await withAccounts { env in
            let known = try await env.signUp().user.email
            var request = Accounts_V1_RequestPasswordResetRequest()
            request.email = known
            let a = try await env.accounts.requestPasswordResetWithMetadata(request)
            request.email = "nobody-\(UUID().uuidString.prefix(6))@example.com"
            let b = try await env.accounts.requestPasswordResetWithMetadata(request)
            #expect(a.message == b.message)
            #expect(a.trailers == b.trailers)
            #expect(try await env.waitForMail(to: known).count == 1)
            #expect(try await env.waitForMail(to: request.email, timeout: .milliseconds(300)).isEmpty)
            request.email = "not an email"
            await expectFailure(.invalidArgument, fields: ["email"]) { try await env.accounts.requestPasswordReset(request) }
        }
    }

    @Test func resetTokensExpire() async throws {
        try await withAccounts({ $0.resetTokenLifetime = .seconds(1) }) { env in
            let user = try await env.signUp().user
            var request = Accounts_V1_RequestPasswordResetRequest()
            request.email = user.email
            _ = try await env.accounts.requestPasswordReset(request)
            let token = try #require(try await env.waitForMail(to: user.email).first?.data["reset_token"])
            try await Task.sleep(for: .milliseconds(1200))
            var reset = Accounts_V1_ResetPasswordRequest()
            reset.resetToken = token
            reset.newPassword = "new-harbour-lights-19"
            await expectFailure(.failedPrecondition, fields: ["reset_token"]) { try await env.accounts.resetPassword(reset) }
        }
    }

    @Test func resetRequestsAreThrottledPerEmailAndPerAddress() async throws {
        try await withAccounts({ c in
            c.maxResetRequestsPerEmail = 2
            c.maxResetRequestsPerAddress = 4
        }) { env in
            var request = Accounts_V1_RequestPasswordResetRequest()
            request.email = "someone@example.com"
            for _ in 0..<2 { _ = try await env.accounts.requestPasswordReset(request) }
            let f = await expectFailure(.resourceExhausted) { try await env.accounts.requestPasswordReset(request) }
            #expect((f?.retryDelaySeconds ?? 0) > 0)
            request.email = "another@example.com"
            _ = try await env.accounts.requestPasswordReset(request)
            request.email = "third@example.com"
            await expectFailure(.resourceExhausted) { try await env.accounts.requestPasswordReset(request) }
        }
    }

    @Test func secretsAreNeverStoredOrLoggedInClear() async throws {
        try await withAccounts { env in
            let password = "Very-Secret-Passphrase-\(UUID().uuidString)"
            let name = uniqueName()
            let signed = try await env.signUp(name, password: password)
            let refreshed = try await env.accounts.refreshSession(refresh(signed.session.refreshToken)).session
            _ = try? await env.logIn(name, "Wrong-Passphrase-\(UUID().uuidString)")
            var request = Accounts_V1_RequestPasswordResetRequest()
            request.email = signed.user.email
            _ = try await env.accounts.requestPasswordReset(request)
            let token = try #require(try await env.waitForMail(to: signed.user.email).first?.data["reset_token"])
            var reset = Accounts_V1_ResetPasswordRequest()
            reset.resetToken = token
            reset.newPassword = password + "-2"
            _ = try await env.accounts.resetPassword(reset)

            let secrets = [
                password, password + "-2", signed.session.refreshToken, refreshed.refreshToken, token,
                signed.session.accessToken, refreshed.accessToken,
            ]
            // Not in the database (nor its WAL).
            let files = try FileManager.default.contentsOfDirectory(atPath: env.directory).filter { $0.hasPrefix("accounts.sqlite") }
            for file in files {
                let bytes = try #require(FileManager.default.contents(atPath: "\(env.directory)/\(file)"))
                for secret in secrets {
                    #expect(bytes.range(of: Data(secret.utf8)) == nil, "a secret is in \(file) in clear")
                }
            }
            // The stored password is an scrypt string, the refresh token a SHA-256.
            let stored = try env.core.database.readSync { c in
                try c.queryOne("SELECT password_hash FROM users WHERE id = ?", signed.user.userId)?.get(0, as: String.self)
            }
            #expect(stored?.hasPrefix("scrypt$1024$8$1$") == true)
            let hashes = try env.core.database.readSync { c in
                try c.query("SELECT token_hash FROM refresh_tokens").map { try $0.get(0, as: [UInt8].self) }
            }
            #expect(hashes.allSatisfy { $0.count == 32 })
            // Not in any log line.
            for line in env.logs.all {
                for secret in secrets { #expect(!line.contains(secret), "a secret was logged: \(line.prefix(120))") }
            }
            #expect(!env.logs.all.isEmpty)
        }
    }

    @Test func resetMailIsAnRFC5322FileInTheMaildir() async throws {
        try await withAccounts { env in
            let user = try await env.signUp(displayName: "Zoë").user
            var request = Accounts_V1_RequestPasswordResetRequest()
            request.email = user.email
            _ = try await env.accounts.requestPasswordReset(request)
            let mail = try #require(try await env.waitForMail(to: user.email).first)
            let newDir = "\(env.directory)/mail/new"
            let names = try FileManager.default.contentsOfDirectory(atPath: newDir)
            let name = try #require(names.first { $0.contains(mail.mailId) })
            let attributes = try FileManager.default.attributesOfItem(atPath: "\(newDir)/\(name)")
            #expect((attributes[.posixPermissions] as? Int) == 0o600)
            let text = String(decoding: try #require(FileManager.default.contents(atPath: "\(newDir)/\(name)")), as: UTF8.self)
            #expect(text.contains("\r\n\r\n"))
            for header in [
                "Date: ", "From: ", "To: \(user.email)\r\n", "Subject: Reset your password\r\n", "Message-ID: <\(mail.mailId)@",
                "MIME-Version: 1.0", "Content-Type: text/plain; charset=utf-8",
            ] {
                #expect(text.contains(header), "missing \(header)")
            }
            #expect(text.utf8.allSatisfy { $0 < 0x80 })
            #expect(try FileManager.default.contentsOfDirectory(atPath: "\(env.directory)/mail/tmp").isEmpty)
        }
    }
}
