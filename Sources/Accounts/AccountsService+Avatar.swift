import Contracts
import RPCCore
import ServiceKit
import Storage

/// The built-in avatar catalogue (E 5.1): ids are stable, clients ship the matching art.
enum BuiltinAvatars {
    static let all: [(id: String, name: String)] = [
        ("red-fox", "Red fox"),
        ("blue-owl", "Blue owl"),
        ("green-frog", "Green frog"),
        ("golden-bear", "Golden bear"),
    ]

    static func named(_ id: String) -> Accounts_V1_BuiltinAvatar? {
        guard let a = all.first(where: { $0.id == id }) else { return nil }
        var b = Accounts_V1_BuiltinAvatar()
        b.avatarId = a.id
        b.name = a.name
        return b
    }
}

/// Image formats recognised by their first bytes, never by what the client claims.
enum ImageSniffer {
    static func format(of bytes: [UInt8]) -> Accounts_V1_ImageFormat? {
        if bytes.starts(with: [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]) { return .png }
        if bytes.starts(with: [0xFF, 0xD8, 0xFF]) { return .jpeg }
        if bytes.count >= 12, bytes.starts(with: Array("RIFF".utf8)), Array(bytes[8..<12]) == Array("WEBP".utf8) { return .webp }
        return nil
    }
}

extension AccountsService {
    public func uploadAvatar(request: Accounts_V1_UploadAvatarRequest, context: ServerContext) async throws -> Accounts_V1_UploadAvatarResponse {
        let caller = try core.caller(context)
        let image = request.image
        let limit = core.configuration.maxAvatarBytes
        guard !image.isEmpty else { throw FieldErrors.single(.invalidArgument, field: "image", "required") }
        guard image.count <= limit else {
            throw FieldErrors.single(.resourceExhausted, field: "image", "\(image.count) bytes is larger than the limit of \(limit) bytes")
        }
        guard let format = ImageSniffer.format(of: image) else {
            throw FieldErrors.single(.invalidArgument, field: "image", "not a PNG, JPEG or WebP image")
        }
        let user = try await core.write { tx -> UserRecord in
            _ = try core.callerRecord(tx, caller)
            let now = SystemClock.nowMilliseconds()
            try tx.execute(
                "INSERT INTO avatar_images (user_id, data) VALUES (?, ?) ON CONFLICT(user_id) DO UPDATE SET data = excluded.data",
                caller.userID, image)
            try tx.execute(
                "UPDATE users SET avatar_builtin = NULL, avatar_format = ?, avatar_size = ?, avatar_uploaded_at = ?, updated_at = ? WHERE id = ?",
                Int64(format.rawValue), image.count, now, now, caller.userID)
            return try UserQueries.byID(tx, caller.userID)!
        }
        var response = Accounts_V1_UploadAvatarResponse()
        if let avatar = user.avatar { response.avatar = avatar }
        return response
    }

    public func chooseAvatar(request: Accounts_V1_ChooseAvatarRequest, context: ServerContext) async throws -> Accounts_V1_ChooseAvatarResponse {
        let caller = try core.caller(context)
        let id = AccountRules.trimmed(request.builtinAvatarId)
        guard !id.isEmpty else { throw FieldErrors.single(.invalidArgument, field: "builtin_avatar_id", "required") }
        guard BuiltinAvatars.named(id) != nil else {
            throw FieldErrors.single(.invalidArgument, field: "builtin_avatar_id", "unknown built-in avatar (see ListBuiltinAvatars)")
        }
        let user = try await core.write { tx -> UserRecord in
            _ = try core.callerRecord(tx, caller)
            let now = SystemClock.nowMilliseconds()
            try tx.execute("DELETE FROM avatar_images WHERE user_id = ?", caller.userID)
            try tx.execute(
                "UPDATE users SET avatar_builtin = ?, avatar_format = NULL, avatar_size = NULL, avatar_uploaded_at = NULL, updated_at = ? WHERE id = ?",
                id, now, caller.userID)
            return try UserQueries.byID(tx, caller.userID)!
        }
        var response = Accounts_V1_ChooseAvatarResponse()
        if let avatar = user.avatar { response.avatar = avatar }
        return response
    }

    public func getAvatar(request: Accounts_V1_GetAvatarRequest, context: ServerContext) async throws -> Accounts_V1_GetAvatarResponse {
        _ = try core.caller(context)
        let userID = AccountRules.trimmed(request.userId)
        guard !userID.isEmpty else { throw FieldErrors.single(.invalidArgument, field: "user_id", "required") }
        let found = try await core.read { c -> (UserRecord, [UInt8]?)? in
            guard let user = try UserQueries.byID(c, userID) else { return nil }
            let data =
                user.avatarFormat == nil
                ? nil
                : try c.queryOne("SELECT data FROM avatar_images WHERE user_id = ?", userID)?.get(0, as: [UInt8].self)
            return (user, data)
        }
        guard let (user, data) = found else { throw RPCError(.notFound, "no such user") }
        var response = Accounts_V1_GetAvatarResponse()
        if let id = user.avatarBuiltin, let builtin = BuiltinAvatars.named(id) {
            response.builtin = builtin
        } else if let format = user.avatarFormat, let data, let at = user.avatarUploadedAt {
            var image = Accounts_V1_AvatarImage()
            image.format = format
            image.data = data
            image.uploadedAt = Google_Protobuf_Timestamp(milliseconds: at)
            response.image = image
        }
        return response
    }

    public func listBuiltinAvatars(
        request: Accounts_V1_ListBuiltinAvatarsRequest, context: ServerContext
    ) async throws -> Accounts_V1_ListBuiltinAvatarsResponse {
        _ = try core.caller(context)
        var response = Accounts_V1_ListBuiltinAvatarsResponse()
        response.avatars = BuiltinAvatars.all.compactMap { BuiltinAvatars.named($0.id) }
        return response
    }

    // MARK: Deletion

    public func deleteAccount(request: Accounts_V1_DeleteAccountRequest, context: ServerContext) async throws -> Accounts_V1_DeleteAccountResponse {
        let caller = try core.caller(context)
        let user = try await core.read { c in try core.callerRecord(c, caller) }
        if let stored = user.passwordHash {
            guard !request.password.isEmpty else { throw FieldErrors.single(.invalidArgument, field: "password", "required") }
            guard
                try await core.checkPassword(
                    request.password, against: stored, account: "user:\(user.id)",
                    address: core.clientAddress(context))
            else {
                throw FieldErrors.single(.invalidArgument, field: "password", "is not the password of this account")
            }
        } else if !request.password.isEmpty {
            throw FieldErrors.single(.invalidArgument, field: "password", "must be empty: a guest account has no password")
        }

        let (deletedAt, revokedIDs) = try await core.write { tx -> (Int64, [String]) in
            _ = try core.callerRecord(tx, caller)
            return try AccountDeletion.erase(tx, userID: caller.userID, reason: "account deleted")
        }
        core.revoked.add(revokedIDs + [caller.sessionID])
        core.logger.notice("account deleted; erase events queued", metadata: ["user": "\(caller.userID)"])
        var response = Accounts_V1_DeleteAccountResponse()
        response.deletedAt = Google_Protobuf_Timestamp(milliseconds: deletedAt)
        return response
    }
}

/// Deleting an account (DeleteAccount, and unused guests expiring): one transaction that turns
/// the user into a tombstone and queues its erasure in every other service.
enum AccountDeletion {
    /// The outbox kind of the deletion events (one per erasing service, one event id).
    static let userDeletedKind = "accounts.v1.UserDeleted"

    /// How a `UserDeleted` event reaches its service: `<Service>Internal/EraseUser` with
    /// `EraseUserRequest{event_id, user_id}` (the same two fields, numbered alike, in every
    /// service's contract).
    static let eraseRoute: OutboxSenders.Route = { event in
        guard let path = OutboxCall.eraseUserPath(of: event.destination) else {
            throw RPCError(.internal, "no EraseUser in the contracts for destination \(event.destination)")
        }
        let deleted = try Accounts_V1_UserDeleted(serializedBytes: event.payload)
        var request = Accounts_V1_UserDeleted()
        (request.eventId, request.userId) = (deleted.eventId, deleted.userId)
        return (path, request.serializedBytes())
    }

    /// In `tx`: the user row becomes a tombstone (id and timestamps kept, `deleted_at` set;
    /// username, email, password hash, display name, contact and avatar cleared, the image
    /// deleted), every session revoked, reset tokens deleted, and one `UserDeleted` event queued
    /// per service that has an EraseUser in the contracts (`OutboxCall.eraseUserPaths`), all with
    /// one event id (outbox ids `<event id>:<service>`).
    /// Returns the deletion time and the revoked session ids.
    static func erase(_ tx: Transaction, userID: String, reason: String) throws -> (deletedAt: Int64, revoked: [String]) {
        let now = SystemClock.nowMilliseconds()
        try tx.execute(
            """
            UPDATE users SET deleted_at = ?, updated_at = ?, username = NULL, username_key = NULL, email = NULL,
                email_key = NULL, password_hash = NULL, display_name = '', phone_number = '', public_email = '',
                has_contact = 0, avatar_builtin = NULL, avatar_format = NULL, avatar_size = NULL, avatar_uploaded_at = NULL
            WHERE id = ?
            """, now, now, userID)
        try tx.execute("DELETE FROM avatar_images WHERE user_id = ?", userID)
        try tx.execute("DELETE FROM password_resets WHERE user_id = ?", userID)
        let revoked = try SessionQueries.revokeAll(tx, userID: userID, reason: reason, now: now)
        let eventID = ULID.make()
        var event = Accounts_V1_UserDeleted()
        event.eventId = eventID
        event.userId = userID
        event.deletedAt = Google_Protobuf_Timestamp(milliseconds: now)
        let payload = event.serializedBytes()
        for (destination, _) in OutboxCall.eraseUserPaths where destination != "accounts" {
            try tx.enqueueOutbox(
                eventID: "\(eventID):\(destination)", destination: destination, kind: AccountDeletion.userDeletedKind,
                payload: payload)
        }
        return (now, revoked)
    }
}

extension AccountsCore {
    /// Deletes guest accounts nobody can use any more: a guest has no password, so once its last
    /// refresh token expired (`refreshTokenLifetime`, 30 days without use) no one can ever sign
    /// in to it again. Deleted like DeleteAccount (the other services erase it too).
    public func expireUnusedGuests(now: Int64 = SystemClock.nowMilliseconds(), limit: Int = 500) async throws -> Int {
        let cutoff = now - configuration.refreshTokenLifetime.milliseconds
        let (count, revoked) = try await write { tx -> (Int, [String]) in
            let ids = try tx.query(
                """
                SELECT u.id FROM users u
                WHERE u.guest = 1 AND u.deleted_at IS NULL AND u.created_at < ?
                  AND NOT EXISTS (SELECT 1 FROM sessions s JOIN refresh_tokens r ON r.session_id = s.id
                                  WHERE s.user_id = u.id AND s.revoked_at IS NULL AND r.rotated_at IS NULL AND r.expires_at > ?)
                LIMIT ?
                """, cutoff, now, limit
            ).map { try $0.get(0, as: String.self) }
            var revoked: [String] = []
            for id in ids { revoked += try AccountDeletion.erase(tx, userID: id, reason: "unused guest expired").revoked }
            return (ids.count, revoked)
        }
        self.revoked.add(revoked)
        return count
    }
}
