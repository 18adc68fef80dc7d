import Contracts
import Logging
import Security
import ServiceKit
import Storage
import Synchronization

/// Sends password reset mails off the request path. RequestPasswordReset only queues the address,
/// so its answer and its timing are the same for known and unknown emails; this loop looks the
/// account up, stores the token's hash, and hands the mail to the sink.
///
/// The queue is in memory: a crash loses the requests not yet mailed, and the user asks again
/// (nothing a client was promised is lost — the answer never said a mail was sent).
final class ResetMailer: Sendable {
    private let stream: AsyncStream<String>
    private let continuation: AsyncStream<String>.Continuation

    init() {
        (stream, continuation) = AsyncStream.makeStream(of: String.self, bufferingPolicy: .bufferingNewest(10_000))
    }

    func enqueue(_ email: String) { continuation.yield(email) }

    func run(core: AccountsCore) async {
        await withTaskCancellationHandler {
            for await email in stream {
                await send(to: email, core: core)
            }
        } onCancel: { [continuation] in
            continuation.finish()
        }
    }

    private func send(to email: String, core: AccountsCore) async {
        let token = SecureRandom.token(bytes: 32)
        let lifetime = core.configuration.resetTokenLifetime
        let user: UserRecord?
        do {
            // Most requests name no account (typos, probing): a read answers those without
            // taking the writer.
            guard
                try await core.database.read({ c in
                    try UserQueries.byEmail(c, email).map { !$0.guest && $0.passwordHash != nil } ?? false
                })
            else { return }
            user = try await core.database.write { tx -> UserRecord? in
                guard let user = try UserQueries.byEmail(tx, email), !user.guest, user.passwordHash != nil else { return nil }
                let now = SystemClock.nowMilliseconds()
                try tx.execute(
                    "INSERT INTO password_resets (token_hash, user_id, created_at, expires_at) VALUES (?, ?, ?, ?)",
                    SHA256.hash(token), user.id, now, now + lifetime.milliseconds)
                return user
            }
        } catch {
            core.logger.error("cannot store a reset token", metadata: ["error": "\(error)"])
            return
        }
        guard let user else { return }  // unknown email: nothing to send, nothing to say
        let minutes = lifetime.components.seconds / 60
        let mail = MailMessage(
            mailID: ULID.make(), kind: .passwordReset, from: core.configuration.mailFrom, to: user.email,
            subject: "Reset your password",
            body: """
                Someone asked to reset the password of your account \(user.username).
                Your reset code: \(token)
                It works once, for \(minutes) minutes. If it was not you, ignore this mail.
                """,
            data: ["reset_token": token], createdAt: SystemClock.nowMilliseconds())
        for attempt in 1...3 {
            do {
                try await core.mail.deliver(mail)
                core.logger.info("reset mail sent", metadata: ["user": "\(user.id)", "mail": "\(mail.mailID)"])
                return
            } catch {
                core.logger.warning("reset mail not delivered", metadata: ["user": "\(user.id)", "attempt": "\(attempt)", "error": "\(error)"])
                try? await Task.sleep(for: .seconds(attempt * 2))
            }
        }
        // Undeliverable: the token must not outlive the mail nobody received.
        _ = try? await core.database.write { tx in
            try tx.execute("DELETE FROM password_resets WHERE token_hash = ?", SHA256.hash(token))
        }
    }
}
