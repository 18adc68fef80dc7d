import Contracts
import Foundation
import Logging
import RPCCore
import Security
import ServiceKit
import Storage

/// `accounts.v1.Accounts`: sign-up, log-in, sessions, guests, passwords, profiles, avatars,
/// deletion and the token keys. Every handler validates the whole request first (one
/// INVALID_ARGUMENT naming every bad field), does blocking work only through the storage and
/// hashing threads, and writes each change in one transaction.
public struct AccountsService: Accounts_V1_AccountsService {
    let core: AccountsCore

    /// The one answer to every wrong-credential login, whatever was wrong (no user enumeration).
    static let wrongCredentials = RPCError(.unauthenticated, "wrong username, email or password")

    // MARK: Sign-up and log-in

    public func signUp(request: Accounts_V1_SignUpRequest, context: ServerContext) async throws -> Accounts_V1_SignUpResponse {
        var errors = FieldErrors()
        let username = AccountRules.username(request.username, into: &errors)
        let email = AccountRules.email(request.email, into: &errors)
        AccountRules.newPassword(request.password, into: &errors)
        let displayName = AccountRules.displayName(request.displayName, into: &errors)
        let contact = request.hasContactInfo ? AccountRules.contactInfo(request.contactInfo, into: &errors) : nil
        try errors.throwIfAny()

        // Taken names fail before the (deliberately slow) hash; the write checks again.
        let taken = try await core.read { c in try UserQueries.taken(c, username: username, email: email) }
        if !taken.isEmpty { throw Self.alreadyTaken(taken) }
        // Sign-ups per client address, counted before the hash (a flood from one address must
        // not fill the hashing queue); one that fails for another reason is not counted.
        let signUp: SlidingWindowThrottle.Reservation
        let address = core.clientAddress(context)
        switch core.signUpsByAddress.reserve(address) {
        case .success(let r): signUp = r
        case .failure(let wait): throw RPCError.throttled("too many sign-ups from this address", wait: wait)
        }
        let hash: String
        do { hash = try await core.hashPassword(request.password) } catch {
            signUp.release()
            throw error
        }

        let userID = ULID.make()
        let session = NewSession(userID: userID, guest: false, refreshLifetime: core.sessionLifetime)
        let user: UserRecord
        do {
            user = try await core.write { tx in
                let taken = try UserQueries.taken(tx, username: username, email: email)
                if !taken.isEmpty { throw Self.alreadyTaken(taken) }
                try tx.execute(
                    """
                    INSERT INTO users (id, username, username_key, email, email_key, password_hash, display_name,
                                       phone_number, public_email, has_contact, guest, created_at, updated_at)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?)
                    """,
                    userID, username, AccountRules.key(username), email, AccountRules.key(email), hash, displayName,
                    contact?.phoneNumber ?? "", contact?.publicEmail ?? "", contact != nil, session.now, session.now
                )
                try session.insert(tx)
                try tx.execute("INSERT INTO accounts_by_address (address, guest, made_at) VALUES (?, 0, ?)", address, session.now)
                return try UserQueries.byID(tx, userID)!
            }
        } catch {
            signUp.release()  // not an account made: it does not count against the address
            throw error
        }
        signUp.keep()
        core.logger.info("signed up", metadata: ["user": "\(userID)"])
        var response = Accounts_V1_SignUpResponse()
        response.user = user.proto
        response.session = session.proto(keys: core.keys, accessLifetime: core.configuration.accessTokenLifetime)
        return response
    }

    static func alreadyTaken(_ fields: [String]) -> RPCError {
        var errors = FieldErrors()
        for f in fields { errors.add(f, "already taken") }
        return errors.error(.alreadyExists, summary: "already exists")
    }

    public func logIn(request: Accounts_V1_LogInRequest, context: ServerContext) async throws -> Accounts_V1_LogInResponse {
        var errors = FieldErrors()
        var identifier = ""
        var byEmail = false
        switch request.identifier {
        case .username(let u)?:
            identifier = AccountRules.trimmed(u)
            if identifier.isEmpty { errors.add("username", "required") }
        case .email(let e)?:
            identifier = AccountRules.trimmed(e)
            byEmail = true
            if identifier.isEmpty { errors.add("email", "required") }
        case nil:
            errors.add("username", "set username or email")
        }
        if request.password.isEmpty {
            errors.add("password", "required")
        } else if AccountRules.length(request.password) > AccountRules.passwordLength.upperBound {
            errors.add("password", "must be at most 128 characters")
        }
        try errors.throwIfAny()

        let address = core.clientAddress(context)
        let (id, email) = (identifier, byEmail)
        let found = try await core.read { c in email ? try UserQueries.byEmail(c, id) : try UserQueries.byUsername(c, id) }
        // Unknown identifiers are throttled by name, so they behave exactly like real accounts.
        let accountKey = found.map { "user:\($0.id)" } ?? "name:\(AccountRules.key(identifier))"

        guard let user = found, let stored = user.passwordHash else {
            // The attempt is reserved before the (simulated) check, as for a real account.
            let attempt = try core.reservePasswordAttempt(account: accountKey, address: address)
            do { try await core.simulateVerify(request.password) } catch {
                attempt.release()
                throw error
            }
            attempt.keep()
            throw Self.wrongCredentials
        }
        guard try await core.checkPassword(request.password, against: stored, account: accountKey, address: address) else {
            core.logger.info("failed login", metadata: ["user": "\(user.id)", "address": "\(address)"])
            throw Self.wrongCredentials
        }
        // A hash made with older (cheaper) parameters is replaced while we know the password.
        let rehash = core.hasher.needsRehash(stored) ? try? await core.hashPassword(request.password) : nil

        let session = NewSession(userID: user.id, guest: false, refreshLifetime: core.sessionLifetime)
        let current = try await core.write { tx -> UserRecord? in
            guard let current = try UserQueries.byID(tx, user.id), current.passwordHash == stored else { return nil }
            if let rehash { try tx.execute("UPDATE users SET password_hash = ? WHERE id = ?", rehash, user.id) }
            try session.insert(tx)
            return current
        }
        // Deleted, or the password changed, between the check and the write.
        guard let current else { throw Self.wrongCredentials }
        var response = Accounts_V1_LogInResponse()
        response.user = current.proto
        response.session = session.proto(keys: core.keys, accessLifetime: core.configuration.accessTokenLifetime)
        return response
    }

    // MARK: Sessions

    enum RefreshOutcome: Sendable {
        case rotated(NewSession)
        case unknown
        case expired
        case reused(sessionID: String)
    }

    public func refreshSession(request: Accounts_V1_RefreshSessionRequest, context: ServerContext) async throws -> Accounts_V1_RefreshSessionResponse
    {
        let token = AccountRules.trimmed(request.refreshToken)
        guard !token.isEmpty else { throw FieldErrors.single(.invalidArgument, field: "refresh_token", "required") }
        guard token.utf8.count <= 256 else { throw RPCError(.unauthenticated, "unknown refresh token: log in again") }
        let hash = SHA256.hash(token)
        let lifetime = core.sessionLifetime
        let outcome = try await core.write { tx -> RefreshOutcome in
            guard
                let row = try tx.queryOne(
                    """
                    SELECT r.session_id, r.expires_at, r.rotated_at, s.user_id, s.revoked_at, u.guest, u.deleted_at
                    FROM refresh_tokens r JOIN sessions s ON s.id = r.session_id JOIN users u ON u.id = s.user_id
                    WHERE r.token_hash = ?
                    """, hash)
            else { return .unknown }
            let sessionID: String = try row.get("session_id")
            let now = SystemClock.nowMilliseconds()
            guard try row.get("revoked_at", as: Int64?.self) == nil, try row.get("deleted_at", as: Int64?.self) == nil else { return .unknown }
            if try row.get("rotated_at", as: Int64?.self) != nil {
                // Someone kept a token its owner already exchanged: the family is compromised.
                try SessionQueries.revoke(tx, sessionID: sessionID, reason: "refresh token reuse", now: now)
                return .reused(sessionID: sessionID)
            }
            guard try row.get("expires_at", as: Int64.self) > now else { return .expired }
            let next = NewSession(userID: try row.get("user_id"), guest: try row.get("guest"), sessionID: sessionID, refreshLifetime: lifetime)
            try tx.execute("UPDATE refresh_tokens SET rotated_at = ? WHERE token_hash = ?", now, hash)
            try next.insertToken(tx)
            try tx.execute("UPDATE sessions SET refreshed_at = ? WHERE id = ?", now, sessionID)
            return .rotated(next)
        }
        switch outcome {
        case .rotated(let next):
            var response = Accounts_V1_RefreshSessionResponse()
            response.session = next.proto(keys: core.keys, accessLifetime: core.configuration.accessTokenLifetime)
            return response
        case .unknown:
            throw RPCError(.unauthenticated, "unknown or revoked refresh token: log in again")
        case .expired:
            throw RPCError(.unauthenticated, "refresh token expired: log in again")
        case .reused(let sessionID):
            core.revoked.add([sessionID])
            core.logger.warning("refresh token reused: session revoked", metadata: ["session": "\(sessionID)"])
            throw RPCError(.unauthenticated, "this refresh token was already used; the session has been revoked for safety: log in again")
        }
    }

    public func logOut(request: Accounts_V1_LogOutRequest, context: ServerContext) async throws -> Accounts_V1_LogOutResponse {
        let caller = try core.caller(context)
        let all = request.allSessions
        let ids = try await core.write { tx -> [String] in
            let now = SystemClock.nowMilliseconds()
            if all { return try SessionQueries.revokeAll(tx, userID: caller.userID, reason: "log out everywhere", now: now) }
            try SessionQueries.revoke(tx, sessionID: caller.sessionID, reason: "log out", now: now)
            return [caller.sessionID]
        }
        core.revoked.add(ids + [caller.sessionID])
        var response = Accounts_V1_LogOutResponse()
        response.revokedSessions = Int32(max(1, ids.count))
        return response
    }

    // MARK: Guests

    public func createGuest(request: Accounts_V1_CreateGuestRequest, context: ServerContext) async throws -> Accounts_V1_CreateGuestResponse {
        var errors = FieldErrors()
        var displayName = AccountRules.displayName(request.displayName, into: &errors)
        try errors.throwIfAny()
        if displayName.isEmpty { displayName = "Guest" }
        let address = core.clientAddress(context)
        if let wait = core.guestsByAddress.attempt(address) {
            throw AccountsCore.throttled("too many guest accounts from this address", waitMilliseconds: wait)
        }

        let userID = ULID.make()
        let session = NewSession(userID: userID, guest: true, refreshLifetime: core.sessionLifetime)
        let name = displayName
        let user = try await core.write { tx in
            var username = ""
            repeat {  // 2^32 names: a collision is rare, and simply draws again
                username = AccountRules.guestPrefix + SecureRandom.bytes(4).map { String(format: "%02x", $0) }.joined()
            } while try tx.queryOne("SELECT 1 FROM users WHERE username_key = ?", username) != nil
            try tx.execute(
                "INSERT INTO users (id, username, username_key, display_name, guest, created_at, updated_at) VALUES (?, ?, ?, ?, 1, ?, ?)",
                userID, username, username, name, session.now, session.now
            )
            try session.insert(tx)
            try tx.execute("INSERT INTO accounts_by_address (address, guest, made_at) VALUES (?, 1, ?)", address, session.now)
            return try UserQueries.byID(tx, userID)!
        }
        var response = Accounts_V1_CreateGuestResponse()
        response.user = user.proto
        response.session = session.proto(keys: core.keys, accessLifetime: core.configuration.accessTokenLifetime)
        return response
    }

    public func upgradeGuest(request: Accounts_V1_UpgradeGuestRequest, context: ServerContext) async throws -> Accounts_V1_UpgradeGuestResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let username = AccountRules.username(request.username, into: &errors)
        let email = AccountRules.email(request.email, into: &errors)
        AccountRules.newPassword(request.password, into: &errors)
        let displayName = AccountRules.displayName(request.displayName, into: &errors)
        let contact = request.hasContactInfo ? AccountRules.contactInfo(request.contactInfo, into: &errors) : nil
        try errors.throwIfAny()

        // Checked before the (slow) hash; the write checks again.
        let (user, taken) = try await core.read { c in
            (try core.callerRecord(c, caller), try UserQueries.taken(c, username: username, email: email, except: caller.userID))
        }
        guard user.guest else { throw RPCError(.failedPrecondition, "this account is already a full account: UpgradeGuest is for guest accounts") }
        if !taken.isEmpty { throw Self.alreadyTaken(taken) }
        let hash = try await core.hashPassword(request.password)

        let session = NewSession(userID: caller.userID, guest: false, refreshLifetime: core.sessionLifetime)
        let (upgraded, revokedIDs) = try await core.write { tx -> (UserRecord, [String]) in
            let current = try core.callerRecord(tx, caller)
            guard current.guest else { throw RPCError(.failedPrecondition, "this account is already a full account") }
            let taken = try UserQueries.taken(tx, username: username, email: email, except: caller.userID)
            if !taken.isEmpty { throw Self.alreadyTaken(taken) }
            let now = session.now
            try tx.execute(
                """
                UPDATE users SET username = ?, username_key = ?, email = ?, email_key = ?, password_hash = ?, guest = 0,
                    display_name = ?, phone_number = ?, public_email = ?, has_contact = ?, updated_at = ?
                WHERE id = ?
                """,
                username, AccountRules.key(username), email, AccountRules.key(email), hash,
                displayName.isEmpty ? current.displayName : displayName,
                contact?.phoneNumber ?? current.contact?.phoneNumber ?? "", contact?.publicEmail ?? current.contact?.publicEmail ?? "",
                contact != nil || current.contact != nil, now, caller.userID
            )
            let revoked = try SessionQueries.revokeAll(tx, userID: caller.userID, reason: "guest upgraded", now: now)
            try session.insert(tx)
            return (try UserQueries.byID(tx, caller.userID)!, revoked)
        }
        core.revoked.add(revokedIDs)
        core.logger.info("guest upgraded", metadata: ["user": "\(caller.userID)"])
        var response = Accounts_V1_UpgradeGuestResponse()
        response.user = upgraded.proto
        response.session = session.proto(keys: core.keys, accessLifetime: core.configuration.accessTokenLifetime)
        return response
    }

    // MARK: Keys

    public func getSigningKeys(request: Accounts_V1_GetSigningKeysRequest, context: ServerContext) async throws -> Accounts_V1_GetSigningKeysResponse
    {
        var response = Accounts_V1_GetSigningKeysResponse()
        response.keys = core.keys.published.map { k in
            var key = Accounts_V1_SigningKey()
            key.keyId = k.keyID
            key.algorithm = .ed25519
            key.publicKey = k.publicKey.rawRepresentation
            key.current = k.retiredAt == nil
            key.createdAt = Google_Protobuf_Timestamp(milliseconds: k.createdAt)
            if let r = k.retiredAt { key.retiredAt = Google_Protobuf_Timestamp(milliseconds: r) }
            return key
        }
        var cache = Google_Protobuf_Duration()
        cache.seconds = core.configuration.signingKeysCacheFor.components.seconds
        response.cacheFor = cache
        return response
    }
}
