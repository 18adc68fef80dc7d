import Contracts
import Logging
import RPCCore
import ServiceKit
import Storage
import Synchronization

extension RPCError {
    /// A peer needed for an answer did not answer in time.
    static func peerUnavailable(_ peer: String, _ what: String) -> RPCError {
        RPCError.retryLater("\(peer) is not answering, so \(what): try again shortly", after: .seconds(2), code: .unavailable)
    }
}

/// Users as matchmaking knows them: accounts owns them; matchmaking keeps the public names of the
/// players it has met (`users`) so matches, challenges and the leaderboard answer without a call.
/// Lookups try the cache and ask accounts (AccountsInternal, short deadline) for the rest;
/// erased users are never cached again.
final class UserDirectory: Sendable {
    let store: ServiceStore
    let peers: PeerClients
    let deadline: Duration
    let clock: any WallClock
    let logger: Logger

    init(store: ServiceStore, peers: PeerClients, deadline: Duration, clock: any WallClock, logger: Logger) {
        self.store = store
        self.peers = peers
        self.deadline = deadline
        self.clock = clock
        self.logger = logger
    }

    var accounts: Accounts_V1_AccountsInternalClient { Accounts_V1_AccountsInternalClient(peers.client("accounts")) }

    func remember(_ refs: [Common_V1_UserRef]) async throws {
        guard !refs.isEmpty else { return }
        let now = clock.nowMilliseconds()
        try await store.write { tx in
            for r in refs where !r.userId.isEmpty {
                try tx.execute(
                    """
                    INSERT INTO users (id, username, display_name, refreshed_at)
                    SELECT ?, ?, ?, ? WHERE NOT EXISTS (SELECT 1 FROM erased_users WHERE id = ?)
                    ON CONFLICT(id) DO UPDATE SET username = excluded.username, display_name = excluded.display_name,
                        refreshed_at = excluded.refreshed_at
                    """,
                    r.userId, r.username, r.displayName, now, r.userId)
            }
        }
    }

    /// One user by id: cached, else from accounts. Nil when accounts says there is no such user
    /// (or it was erased); UNAVAILABLE when it is not cached and accounts cannot answer.
    func user(id: String) async throws -> Common_V1_UserRef? {
        let (cached, erased) = try await store.read { c in
            (try UserNames.refs(c, ids: [id])[id], try c.queryOne("SELECT 1 FROM erased_users WHERE id = ?", id) != nil)
        }
        if erased { return nil }
        if let cached { return cached }
        var request = Accounts_V1_GetUsersByIdsRequest()
        request.userIds = [id]
        let response: Accounts_V1_GetUsersByIdsResponse
        do { response = try await accounts.getUsersByIds(request, options: CallOptions(timeout: deadline)) } catch {
            logger.warning("accounts did not answer GetUsersByIds", metadata: ["error": "\(error)"])
            throw RPCError.peerUnavailable("accounts", "the user cannot be looked up")
        }
        guard let ref = response.usersById[id] else { return nil }
        try await remember([ref])
        return ref
    }

    /// The caller's own name for the answers that show it: cached or from accounts; only the id
    /// while accounts is down (the names are filled in on a later lookup).
    func bestEffort(id: String) async -> Common_V1_UserRef {
        if let ref = try? await user(id: id) { return ref }
        var r = Common_V1_UserRef()
        r.userId = id
        return r
    }

    /// A user by username (case-insensitive), from accounts (usernames change; ids do not). Nil
    /// when unknown.
    func user(username: String) async throws -> Common_V1_UserRef? {
        var request = Accounts_V1_ResolveUsernamesRequest()
        request.usernames = [username]
        let response: Accounts_V1_ResolveUsernamesResponse
        do { response = try await accounts.resolveUsernames(request, options: CallOptions(timeout: deadline)) } catch {
            logger.warning("accounts did not answer ResolveUsernames", metadata: ["error": "\(error)"])
            throw RPCError.peerUnavailable("accounts", "the username cannot be looked up")
        }
        guard let ref = response.usersByUsername[username] else { return nil }
        let erased = try await store.read { c in try c.queryOne("SELECT 1 FROM erased_users WHERE id = ?", ref.userId) != nil }
        if erased { return nil }
        try await remember([ref])
        return ref
    }
}

/// How two users relate, from social's `CheckRelationship` (short deadline). Challenges and chat
/// ask afresh (`fresh`); while social is down, chat uses the last answer known however old
/// (`freshOrLastKnown`) and challenges refuse. The queue pairs only on an answer up to `cacheFor`
/// old (`cached`), asking in the background for the others; while social is down it waits.
final class Relations: Sendable {
    struct Answer: Sendable {
        var friends: Bool
        var blocked: Bool
        var at: Int64
    }
    let peers: PeerClients
    let deadline: Duration
    let cacheFor: Duration
    let clock: any WallClock
    let logger: Logger
    private let cache = Mutex<[String: Answer]>([:])

    init(
        peers: PeerClients, deadline: Duration, cacheFor: Duration, clock: any WallClock, logger: Logger
    ) {
        self.peers = peers
        self.deadline = deadline
        self.cacheFor = cacheFor
        self.clock = clock
        self.logger = logger
    }

    static func key(_ a: String, _ b: String) -> String { a < b ? "\(a)|\(b)" : "\(b)|\(a)" }

    /// Asks social now; UNAVAILABLE when it cannot answer.
    func fresh(_ a: String, _ b: String) async throws -> Answer {
        var request = Social_V1_CheckRelationshipRequest()
        request.userId = a
        request.otherUserId = b
        let client = Social_V1_SocialInternalClient(peers.client("social"))
        do {
            let r = try await client.checkRelationship(request, options: CallOptions(timeout: deadline))
            let answer = Answer(friends: r.friends, blocked: r.userBlocksOther || r.otherBlocksUser, at: clock.nowMilliseconds())
            cache.withLock { c in
                if c.count > 100_000 { c.removeAll() }
                c[Self.key(a, b)] = answer
            }
            return answer
        } catch {
            logger.warning("social did not answer CheckRelationship", metadata: ["error": "\(error)"])
            throw RPCError.peerUnavailable("social", "the relationship cannot be confirmed")
        }
    }

    /// A cached answer younger than `cacheFor`, or nil.
    func cached(_ a: String, _ b: String) -> Answer? {
        let now = clock.nowMilliseconds()
        return cache.withLock { c in
            guard let hit = c[Self.key(a, b)], now - hit.at < cacheFor.milliseconds else { return nil }
            return hit
        }
    }

    /// A fresh answer; while social cannot answer, the last one known (however old), else
    /// UNAVAILABLE.
    func freshOrLastKnown(_ a: String, _ b: String) async throws -> Answer {
        do { return try await fresh(a, b) } catch {
            if let hit = cache.withLock({ $0[Self.key(a, b)] }) { return hit }
            throw error
        }
    }

    /// Forgets everything about `userID` (erased).
    func forget(userID: String) {
        cache.withLock { c in c = c.filter { !$0.key.split(separator: "|").contains(Substring(userID)) } }
    }
}
