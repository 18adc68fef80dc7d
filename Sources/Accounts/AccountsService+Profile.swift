import Contracts
import RPCCore
import ServiceKit
import Storage

extension AccountsService {
    public func getMyProfile(request: Accounts_V1_GetMyProfileRequest, context: ServerContext) async throws -> Accounts_V1_GetMyProfileResponse {
        let caller = try core.caller(context)
        let user = try await core.read { c in try core.callerRecord(c, caller) }
        var response = Accounts_V1_GetMyProfileResponse()
        response.user = user.proto
        return response
    }

    public func getProfile(request: Accounts_V1_GetProfileRequest, context: ServerContext) async throws -> Accounts_V1_GetProfileResponse {
        _ = try core.caller(context)
        let user: UserRecord?
        switch request.user {
        case .userId(let id)?:
            guard !id.isEmpty else { throw FieldErrors.single(.invalidArgument, field: "user_id", "required") }
            user = try await core.read { c in try UserQueries.byID(c, id) }
        case .username(let name)?:
            let n = AccountRules.trimmed(name)
            guard !n.isEmpty else { throw FieldErrors.single(.invalidArgument, field: "username", "required") }
            user = try await core.read { c in try UserQueries.byUsername(c, n) }
        case nil:
            throw FieldErrors.single(.invalidArgument, field: "user_id", "set user_id or username")
        }
        guard let user else { throw RPCError(.notFound, "no such user") }
        var response = Accounts_V1_GetProfileResponse()
        response.profile = user.publicProfile
        return response
    }

    public func updateProfile(request: Accounts_V1_UpdateProfileRequest, context: ServerContext) async throws -> Accounts_V1_UpdateProfileResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let displayName = request.hasDisplayName ? AccountRules.displayName(request.displayName.value, into: &errors) : nil
        let email = request.hasEmail ? AccountRules.email(request.email.value, into: &errors) : nil
        let contact = request.hasContactInfo ? AccountRules.contactInfo(request.contactInfo, into: &errors) : nil
        try errors.throwIfAny()

        let user = try await core.read { c in try core.callerRecord(c, caller) }
        if email != nil && user.guest {
            throw FieldErrors.single(.failedPrecondition, field: "email", "a guest account has no login email: use UpgradeGuest")
        }
        let updated = try await core.write { tx -> UserRecord in
            let current = try core.callerRecord(tx, caller)
            var sets: [String] = []
            var args: [DatabaseValue] = []
            if let displayName, displayName != current.displayName {
                sets.append("display_name = ?")
                args.append(.text(displayName))
            }
            if let email, email != current.email {
                if AccountRules.key(email) != AccountRules.key(current.email),
                    !(try UserQueries.taken(tx, username: nil, email: email, except: current.id)).isEmpty
                {
                    throw Self.alreadyTaken(["email"])
                }
                sets.append("email = ?, email_key = ?")
                args += [.text(email), .text(AccountRules.key(email))]
                // Reset mails went to the old address: they stop working.
                try tx.execute(
                    "UPDATE password_resets SET used_at = ? WHERE user_id = ? AND used_at IS NULL", SystemClock.nowMilliseconds(), current.id)
            }
            if let contact, contact != current.contact {
                sets.append("phone_number = ?, public_email = ?, has_contact = 1")
                args += [.text(contact.phoneNumber), .text(contact.publicEmail)]
            }
            guard !sets.isEmpty else { return current }
            sets.append("updated_at = ?")
            args += [.integer(SystemClock.nowMilliseconds()), .text(current.id)]
            try tx.execute("UPDATE users SET \(sets.joined(separator: ", ")) WHERE id = ?", arguments: args)
            return try UserQueries.byID(tx, current.id)!
        }
        var response = Accounts_V1_UpdateProfileResponse()
        response.user = updated.proto
        return response
    }

    public func searchUsers(request: Accounts_V1_SearchUsersRequest, context: ServerContext) async throws -> Accounts_V1_SearchUsersResponse {
        _ = try core.caller(context)
        var errors = FieldErrors()
        let prefix = AccountRules.key(AccountRules.trimmed(request.usernamePrefix))
        if AccountRules.length(prefix) > AccountRules.usernameLength.upperBound { errors.add("username_prefix", "must be at most 32 characters") }
        let pageSize = AccountRules.pageSize(request.pageSize, into: &errors)
        var cursor: [String]?
        if !request.pageToken.isEmpty {
            cursor = core.pageTokens.open(request.pageToken, filters: "search-users:\(prefix)", parts: 2)
            if cursor == nil { errors.add("page_token", "not a page token of this search (forged, or made for another prefix)") }
        }
        try errors.throwIfAny()

        // Usernames are ASCII, so every key with the prefix sorts in [prefix, prefix + U+007F).
        var sql = """
            SELECT \(UserRecord.columns), username_key FROM users
            WHERE deleted_at IS NULL AND guest = 0 AND username_key >= ? AND username_key < ?
            """
        var args: [DatabaseValue] = [.text(prefix), .text(prefix + "\u{7F}")]
        if let cursor {
            sql += " AND (username_key > ? OR (username_key = ? AND id > ?))"
            args += [.text(cursor[0]), .text(cursor[0]), .text(cursor[1])]
        }
        sql += " ORDER BY username_key, id LIMIT ?"
        args.append(.integer(Int64(pageSize + 1)))
        let query = sql, arguments = args
        let rows = try await core.read { c in try c.query(query, arguments: arguments) }
        let users = try rows.prefix(pageSize).map(UserRecord.init(row:))
        var response = Accounts_V1_SearchUsersResponse()
        response.users = users.map(\.publicProfile)
        if rows.count > pageSize, let last = users.last {
            response.nextPageToken = core.pageTokens.make(cursor: [AccountRules.key(last.username), last.id], filters: "search-users:\(prefix)")
        }
        return response
    }
}
