import Contracts
import RPCCore
import Security
import ServiceKit
import Storage

extension AccountsService {
    public func changePassword(request: Accounts_V1_ChangePasswordRequest, context: ServerContext) async throws -> Accounts_V1_ChangePasswordResponse
    {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        if request.currentPassword.isEmpty { errors.add("current_password", "required") }
        AccountRules.newPassword(request.newPassword, field: "new_password", into: &errors)
        if !request.newPassword.isEmpty && request.newPassword == request.currentPassword {
            errors.add("new_password", "must differ from the current password")
        }
        try errors.throwIfAny()

        let user = try await core.read { c in try core.callerRecord(c, caller) }
        guard let stored = user.passwordHash else {
            throw RPCError(.failedPrecondition, "a guest account has no password: use UpgradeGuest to set one")
        }
        // The current password is a guessable secret too: same throttle as logins.
        guard
            try await core.checkPassword(
                request.currentPassword, against: stored, account: "user:\(user.id)",
                address: core.clientAddress(context))
        else {
            throw FieldErrors.single(.invalidArgument, field: "current_password", "is not the current password")
        }
        let hash = try await core.hashPassword(request.newPassword)
        let revokedIDs = try await core.write { tx -> [String] in
            let now = SystemClock.nowMilliseconds()
            try tx.execute(
                "UPDATE users SET password_hash = ?, updated_at = ? WHERE id = ? AND password_hash = ? AND deleted_at IS NULL",
                hash, now, caller.userID, stored)
            guard tx.changes == 1 else { throw RPCError(.aborted, "the password changed meanwhile: try again") }
            // Reset mails sent before the change must not undo it.
            try tx.execute("UPDATE password_resets SET used_at = ? WHERE user_id = ? AND used_at IS NULL", now, caller.userID)
            return try SessionQueries.revokeAll(tx, userID: caller.userID, except: caller.sessionID, reason: "password changed", now: now)
        }
        core.revoked.add(revokedIDs)
        core.logger.info("password changed", metadata: ["user": "\(caller.userID)", "revoked": "\(revokedIDs.count)"])
        var response = Accounts_V1_ChangePasswordResponse()
        response.revokedSessions = Int32(revokedIDs.count)
        return response
    }

    public func requestPasswordReset(
        request: Accounts_V1_RequestPasswordResetRequest, context: ServerContext
    ) async throws -> Accounts_V1_RequestPasswordResetResponse {
        var errors = FieldErrors()
        let email = AccountRules.email(request.email, into: &errors)
        try errors.throwIfAny()
        let address = core.clientAddress(context)
        if let wait = core.resetsByAddress.attempt(address) {
            throw AccountsCore.throttled("too many password reset requests from this address", waitMilliseconds: wait)
        }
        if let wait = core.resetsByEmail.attempt(AccountRules.key(email)) {
            throw AccountsCore.throttled("too many password reset requests for this email", waitMilliseconds: wait)
        }
        // The lookup, the token and the mail happen in the background: the answer (and its timing)
        // is the same whether or not the email belongs to an account.
        core.resetMailer.enqueue(email)
        return Accounts_V1_RequestPasswordResetResponse()
    }

    enum ResetOutcome: Sendable {
        case done(userID: String, revoked: [String])
        case invalid
    }

    public func resetPassword(request: Accounts_V1_ResetPasswordRequest, context: ServerContext) async throws -> Accounts_V1_ResetPasswordResponse {
        var errors = FieldErrors()
        let token = AccountRules.trimmed(request.resetToken)
        if token.isEmpty { errors.add("reset_token", "required") }
        AccountRules.newPassword(request.newPassword, field: "new_password", into: &errors)
        try errors.throwIfAny()

        let invalid = FieldErrors.single(.failedPrecondition, field: "reset_token", "unknown, already used or expired reset token: request a new one")
        guard token.utf8.count <= 256 else { throw invalid }
        let tokenHash = SHA256.hash(token)
        // Check before hashing, so garbage tokens cost no scrypt time.
        let valid = try await core.read { c in
            try c.queryOne(
                """
                SELECT 1 FROM password_resets p JOIN users u ON u.id = p.user_id
                WHERE p.token_hash = ? AND p.used_at IS NULL AND p.expires_at > ? AND u.deleted_at IS NULL
                """, tokenHash, SystemClock.nowMilliseconds()) != nil
        }
        guard valid else { throw invalid }
        let hash = try await core.hashPassword(request.newPassword)
        let outcome = try await core.write { tx -> ResetOutcome in
            let now = SystemClock.nowMilliseconds()
            guard
                let row = try tx.queryOne(
                    "SELECT user_id FROM password_resets WHERE token_hash = ? AND used_at IS NULL AND expires_at > ?", tokenHash, now)
            else { return .invalid }
            let userID: String = try row.get(0)
            guard try UserQueries.byID(tx, userID) != nil else { return .invalid }
            // Single use: this token and every other outstanding one of the user.
            try tx.execute("UPDATE password_resets SET used_at = ? WHERE user_id = ? AND used_at IS NULL", now, userID)
            try tx.execute("UPDATE users SET password_hash = ?, updated_at = ? WHERE id = ?", hash, now, userID)
            return .done(userID: userID, revoked: try SessionQueries.revokeAll(tx, userID: userID, reason: "password reset", now: now))
        }
        guard case .done(let userID, let revokedIDs) = outcome else { throw invalid }
        core.revoked.add(revokedIDs)
        core.accountFailures.reset("user:\(userID)")
        core.logger.info("password reset", metadata: ["user": "\(userID)", "revoked": "\(revokedIDs.count)"])
        var response = Accounts_V1_ResetPasswordResponse()
        response.revokedSessions = Int32(revokedIDs.count)
        return response
    }
}
