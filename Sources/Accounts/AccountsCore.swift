import Contracts
import Foundation
import Logging
import RPCCore
import Security
import ServiceKit
import Storage
import Synchronization

/// The state both accounts services share: the database, the token keys, the password hasher, the
/// throttles, the mail sink. `AccountsService` and `AccountsInternalService` are thin wrappers that
/// route each RPC here. Generic parts (storage-error mapping, throttles, the blocking pool, page
/// tokens, ids) come from the service kit.
public final class AccountsCore: Sendable {
    public let configuration: AccountsConfiguration
    public let database: Database
    /// `database` with the kit's error mapping (which unique index is which field).
    let store: ServiceStore
    public let keys: SigningKeyRing
    let hasher: PasswordHasher
    /// Password hashing: 2 threads, a short queue (scrypt is ~50 ms and 32 MiB each).
    let hashing: BlockingPool
    let mail: any MailSink
    let logger: Logger
    let revoked: RevokedSessions
    let pageTokens: PageTokens
    let resetMailer: ResetMailer

    let accountFailures: SlidingWindowThrottle
    let addressFailures: SlidingWindowThrottle
    let resetsByAddress: SlidingWindowThrottle
    let resetsByEmail: SlidingWindowThrottle
    let signUpsByAddress: SlidingWindowThrottle
    let guestsByAddress: SlidingWindowThrottle
    let sendMailInFlight = InFlightKeys()

    /// Which unique index protects which request field (a race lost to a concurrent request).
    static let uniqueFields: [String: ServiceStore.UniqueField] = [
        "users.username_key": .init(field: "username", message: "already taken"),
        "users.email_key": .init(field: "email", message: "already taken"),
    ]

    /// Opens the database (migrating it), loads or creates the signing key, prepares the mail sink.
    /// Blocking: call at startup.
    public init(configuration: AccountsConfiguration, logger: Logger = Logger(label: "accounts")) throws {
        self.configuration = configuration
        self.logger = logger
        database = try Database.open(directory: configuration.dataDirectory, schema: AccountsSchema.schema, logger: logger)
        store = ServiceStore(database: database, uniqueFields: Self.uniqueFields, logger: logger)
        do {
            keys = try SigningKeyRing(
                database: database, dataDirectory: configuration.dataDirectory,
                tokenLifetime: configuration.accessTokenLifetime, logger: logger)
            hasher = try PasswordHasher(parameters: configuration.passwordParameters)
            switch configuration.mail {
            case .maildir(let path): mail = try MaildirSink(path: path)
            case .smtp(let host, let port, let helo): mail = SMTPSink(host: host, port: port, helo: helo)
            }
            revoked = RevokedSessions(accessTokenLifetime: configuration.accessTokenLifetime)
            try revoked.load(from: database)
            pageTokens = try PageTokens.load(from: database)
        } catch {
            database.close()
            throw error
        }
        hashing = BlockingPool(name: "password hashing", threads: configuration.hashingThreads, maxQueued: configuration.maxQueuedHashes)
        accountFailures = SlidingWindowThrottle(
            name: "login_failures_per_account", limit: configuration.maxFailuresPerAccount, window: configuration.failureWindow)
        addressFailures = SlidingWindowThrottle(
            name: "login_failures_per_address", limit: configuration.maxFailuresPerAddress, window: configuration.failureWindow)
        resetsByAddress = SlidingWindowThrottle(
            name: "reset_requests_per_address", limit: configuration.maxResetRequestsPerAddress, window: configuration.resetRequestWindow)
        resetsByEmail = SlidingWindowThrottle(
            name: "reset_requests_per_email", limit: configuration.maxResetRequestsPerEmail, window: configuration.resetRequestWindow)
        signUpsByAddress = SlidingWindowThrottle(
            name: "sign_ups_per_address", limit: configuration.maxSignUpsPerAddress, window: configuration.signUpWindow)
        guestsByAddress = SlidingWindowThrottle(
            name: "guests_per_address", limit: configuration.maxGuestsPerAddress, window: configuration.signUpWindow)
        // The accounts made within the window count after a restart too.
        let since = SystemClock.nowMilliseconds() - configuration.signUpWindow.milliseconds
        let made = try database.readSync { c in
            try c.query("SELECT address, guest, made_at FROM accounts_by_address WHERE made_at > ? ORDER BY made_at", since).map {
                (try $0.get(0, as: String.self), try $0.get(1, as: Int64.self) != 0, try $0.get(2, as: Int64.self))
            }
        }
        for (address, guest, at) in made { (guest ? guestsByAddress : signUpsByAddress).record(address, at: at) }
        resetMailer = ResetMailer()
    }

    /// The public service.
    public var service: AccountsService { AccountsService(core: self) }
    /// The service-to-service API.
    public var internalService: AccountsInternalService { AccountsInternalService(core: self) }
    /// Both, for a server's service list.
    public var services: [any RPCService] { [service, internalService] }

    /// accounts verifies its own tokens with its own public keys (current and retired).
    public var signingKeySource: StaticSigningKeys {
        let keys = self.keys
        return StaticSigningKeys { keys.verificationKeys }
    }

    /// Loops the process runs next to the server: reset mails and upkeep. (The outbox is
    /// delivered by the host: `ServiceHost.run(outbox:)`.)
    public var backgroundJobs: [@Sendable () async -> Void] {
        [{ await self.runResetMails() }, { await self.maintenance() }]
    }

    /// The same, plus a deliverer of the account-deletion events (tests and tools that run their
    /// own outbox delivery).
    public func backgroundJobs(deliverer: UserDeletionDeliverer) -> [@Sendable () async -> Void] {
        backgroundJobs + [{ await deliverer.run() }]
    }

    /// How accounts' outbox reaches the other services: account-deletion events become each
    /// service's `EraseUser`.
    public func outboxSenders(peers: PeerClients) -> OutboxSenders {
        .rpc(peers: peers, routes: [AccountDeletion.userDeletedKind: AccountDeletion.eraseRoute])
    }

    /// Sends the queued password reset mails until cancelled.
    public func runResetMails() async { await resetMailer.run(core: self) }

    /// Closes the database (after the server stopped).
    public func close() { database.close() }

    // MARK: Helpers for the handlers

    var sessionLifetime: Duration { configuration.refreshTokenLifetime }

    /// The verified caller of an authenticated RPC whose session is still live here.
    func caller(_ context: ServerContext) throws -> CallerIdentity {
        let id = try context.requireIdentity()
        if revoked.contains(id.sessionID) {
            throw RPCError(.unauthenticated, "this session has ended (logged out, password changed or account deleted): log in again")
        }
        return id
    }

    /// The caller's live account, or UNAUTHENTICATED when it no longer exists.
    func callerRecord(_ db: some SQLReader, _ id: CallerIdentity) throws -> UserRecord {
        guard let user = try UserQueries.byID(db, id.userID) else {
            throw RPCError(.unauthenticated, "the account of this access token no longer exists")
        }
        return user
    }

    /// The client's address for throttling: the gateway's `x-forwarded-for` (last hop, the one the
    /// gateway itself saw) when the gateway relayed the call, else the TCP peer.
    func clientAddress(_ context: ServerContext) -> String { context.clientAddress }

    /// Runs a database write, mapping storage failures to the wire's vocabulary (the kit's store).
    func write<T: Sendable>(_ body: @escaping @Sendable (Transaction) throws -> T) async throws -> T { try await store.write(body) }

    func read<T: Sendable>(_ body: @escaping @Sendable (Connection) throws -> T) async throws -> T { try await store.read(body) }

    // MARK: Passwords (on the bounded hashing pool)

    /// A new hash of `password`; UNAVAILABLE at once when the hashing queue is full.
    func hashPassword(_ password: String) async throws -> String {
        let hasher = self.hasher
        return try await hashing.run { try hasher.hash(password) }
    }

    /// Whether `password` matches `stored`; UNAVAILABLE at once when the hashing queue is full
    /// (never "wrong password": a shed attempt did not happen).
    func verifyPassword(_ password: String, against stored: String) async throws -> Bool {
        let hasher = self.hasher
        return try await hashing.run { hasher.verify(password, against: stored) }
    }

    /// The time of a `verifyPassword`, for unknown accounts (same answer, same timing).
    func simulateVerify(_ password: String) async throws {
        let hasher = self.hasher
        try await hashing.run { hasher.simulateVerify(password) }
    }

    // MARK: Throttles

    /// RESOURCE_EXHAUSTED with RetryInfo.
    static func throttled(_ what: String, waitMilliseconds: Int64) -> RPCError {
        RPCError.throttled(what, wait: SlidingWindowThrottle.Wait(milliseconds: waitMilliseconds))
    }

    /// A password attempt reserved against the account's and the address's failure limits before
    /// the password is checked (atomically: concurrent guesses cannot all pass a check made
    /// before any of them failed). `release` when the password was right (or never checked),
    /// `keep` when it was wrong.
    struct PasswordAttempt: Sendable {
        let reservations: [SlidingWindowThrottle.Reservation]
        func release() { for r in reservations { r.release() } }
        func keep() {}
    }

    /// Reserves a password attempt, or throws RESOURCE_EXHAUSTED (with RetryInfo) when the account
    /// or the address is at its limit, counting the attempts still being checked.
    func reservePasswordAttempt(account: String?, address: String) throws -> PasswordAttempt {
        var pairs = [(addressFailures, address)]
        if let account { pairs.insert((accountFailures, account), at: 0) }
        switch SlidingWindowThrottle.reserveAll(pairs) {
        case .success(let r): return PasswordAttempt(reservations: r)
        case .failure(let wait): throw RPCError.throttled("too many failed attempts", wait: wait)
        }
    }

    /// Checks `password` against `stored` inside a reserved attempt: a wrong password keeps the
    /// attempt counted, a right one releases it (and clears the account's failures), a check that
    /// could not run (hashing queue full, caller gone) releases it and throws.
    func checkPassword(_ password: String, against stored: String, account: String, address: String) async throws -> Bool {
        let attempt = try reservePasswordAttempt(account: account, address: address)
        let ok: Bool
        do { ok = try await verifyPassword(password, against: stored) } catch {
            attempt.release()
            throw error
        }
        if ok {
            attempt.release()
            accountFailures.reset(account)
        } else {
            attempt.keep()
        }
        return ok
    }

    // MARK: Upkeep

    /// Hourly: rotate an old signing key, purge expired tokens and delivered outbox events, and say
    /// in the log how many deletion events still wait for a peer.
    func maintenance() async {
        while !Task.isCancelled {
            do {
                let keys = self.keys, maxAge = configuration.signingKeyMaxAge
                try await MailIO.run { try keys.maintain(maxAge: maxAge) }
                let now = SystemClock.nowMilliseconds()
                let idle = configuration.refreshTokenLifetime.milliseconds
                let window = configuration.signUpWindow.milliseconds
                try await database.write { tx in
                    // A session whose latest refresh token expired is over; its rows go a month later.
                    try tx.execute(
                        "UPDATE sessions SET revoked_at = ?, revoke_reason = 'expired' WHERE revoked_at IS NULL AND refreshed_at < ?",
                        now, now - idle)
                    try tx.execute("DELETE FROM refresh_tokens WHERE expires_at < ?", now)
                    try tx.execute(
                        "DELETE FROM sessions WHERE revoked_at < ? AND NOT EXISTS (SELECT 1 FROM refresh_tokens r WHERE r.session_id = sessions.id)",
                        now - 31 * 24 * 3600 * 1000)
                    try tx.execute("DELETE FROM password_resets WHERE expires_at < ?", now - 24 * 3600 * 1000)
                    try tx.execute("DELETE FROM accounts_by_address WHERE made_at <= ?", now - window)
                }
                try await store.purgeKitTables(now: now)
                let expired = try await expireUnusedGuests(now: now)
                if expired > 0 { logger.notice("unused guest accounts deleted", metadata: ["count": "\(expired)"]) }
                let pending = try await database.pendingOutbox(limit: 1000)
                if let oldest = pending.first {
                    logger.warning(
                        "account-deletion events waiting for their services (sqlite3 <data-dir>/accounts.sqlite 'select * from outbox where delivered_at is null')",
                        metadata: [
                            "pending": "\(pending.count)", "oldest": "\(oldest.createdAt)",
                            "destinations": "\(Set(pending.map(\.destination)).sorted().joined(separator: ","))",
                        ])
                }
            } catch {
                logger.error("maintenance failed", metadata: ["error": "\(error)"])
            }
            try? await Task.sleep(for: .seconds(3600))
        }
    }
}
