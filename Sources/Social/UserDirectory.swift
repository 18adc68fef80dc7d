import Contracts
import Logging
import RPCCore
import ServiceKit
import Storage
import Synchronization

/// Users as social knows them: accounts owns them, social keeps the public fields of the ones it
/// has met (`users`) so lists sort by username and answer while accounts is down. Lookups try the
/// cache first and ask accounts (`AccountsInternal`, short deadline) for the rest; every answer
/// from accounts refreshes the cache. Erased users (`EraseUser`) are never answered from the
/// cache or stored again.
final class UserDirectory: Sendable {
    let store: ServiceStore
    let peers: PeerClients
    let deadline: Duration
    let clock: any WallClock
    let logger: Logger
    private let refreshing = Atomic<Bool>(false)

    init(store: ServiceStore, peers: PeerClients, deadline: Duration, clock: any WallClock, logger: Logger) {
        self.store = store
        self.peers = peers
        self.deadline = deadline
        self.clock = clock
        self.logger = logger
    }

    var accounts: Accounts_V1_AccountsInternalClient { Accounts_V1_AccountsInternalClient(peers.client("accounts")) }
    var options: CallOptions { CallOptions(timeout: deadline) }

    static func ref(_ row: Row) throws -> Common_V1_UserRef {
        var r = Common_V1_UserRef()
        r.userId = try row.get("id")
        r.username = try row.get("username")
        r.displayName = try row.get("display_name")
        return r
    }

    /// The cached users among `ids`.
    static func cached(_ db: some SQLReader, ids: [String]) throws -> [String: Common_V1_UserRef] {
        var out: [String: Common_V1_UserRef] = [:]
        for id in ids where out[id] == nil {
            if let row = try db.queryOne("SELECT id, username, display_name FROM users WHERE id = ?", id) { out[id] = try ref(row) }
        }
        return out
    }

    /// Stores what accounts said (never for erased users).
    func remember(_ refs: [Common_V1_UserRef]) async throws {
        guard !refs.isEmpty else { return }
        let now = clock.nowMilliseconds()
        try await store.write { tx in
            for r in refs {
                try tx.execute(
                    """
                    INSERT INTO users (id, username, username_key, display_name, refreshed_at)
                    SELECT ?, ?, ?, ?, ? WHERE NOT EXISTS (SELECT 1 FROM erased_users WHERE id = ?)
                    ON CONFLICT(id) DO UPDATE SET username = excluded.username, username_key = excluded.username_key,
                        display_name = excluded.display_name, refreshed_at = excluded.refreshed_at
                    """,
                    r.userId, r.username, FieldRules.key(r.username), r.displayName, now, r.userId)
            }
        }
    }

    /// Users by id: cached ones, the rest from accounts. Unknown, deleted and erased ids are left
    /// out. Throws UNAVAILABLE only when some id is not cached and accounts cannot answer.
    func users(ids: [String]) async throws -> [String: Common_V1_UserRef] {
        let distinct = Array(Set(ids))
        let (found, erased) = try await store.read { c -> ([String: Common_V1_UserRef], Set<String>) in
            var erased = Set<String>()
            for id in distinct where try c.queryOne("SELECT 1 FROM erased_users WHERE id = ?", id) != nil { erased.insert(id) }
            return (try Self.cached(c, ids: distinct.filter { !erased.contains($0) }), erased)
        }
        let missing = distinct.filter { found[$0] == nil && !erased.contains($0) }
        guard !missing.isEmpty else { return found }
        var all = found
        for chunk in stride(from: 0, to: missing.count, by: 200) {
            var request = Accounts_V1_GetUsersByIdsRequest()
            request.userIds = Array(missing[chunk..<min(missing.count, chunk + 200)])
            let response: Accounts_V1_GetUsersByIdsResponse
            do { response = try await accounts.getUsersByIds(request, options: options) } catch {
                logger.warning("accounts did not answer GetUsersByIds", metadata: ["error": "\(error)"])
                throw RPCError.peerUnavailable("accounts")
            }
            try await remember(Array(response.usersById.values))
            for (id, ref) in response.usersById { all[id] = ref }
        }
        return all
    }

    /// One user by id, or nil when unknown.
    func user(id: String) async throws -> Common_V1_UserRef? { try await users(ids: [id])[id] }

    /// Users by username (case-insensitive): found ones keyed by the username as given, and the
    /// unknown ones in the order given.
    func users(usernames: [String]) async throws -> (found: [String: Common_V1_UserRef], unknown: [String]) {
        let cached = try await store.read { c -> [String: Common_V1_UserRef] in
            var out: [String: Common_V1_UserRef] = [:]
            for name in usernames {
                if let row = try c.queryOne("SELECT id, username, display_name FROM users WHERE username_key = ?", FieldRules.key(name)) {
                    out[name] = try Self.ref(row)
                }
            }
            return out
        }
        let missing = usernames.filter { cached[$0] == nil }
        guard !missing.isEmpty else { return (cached, []) }
        var request = Accounts_V1_ResolveUsernamesRequest()
        request.usernames = Array(Set(missing)).sorted()
        let response: Accounts_V1_ResolveUsernamesResponse
        do { response = try await accounts.resolveUsernames(request, options: options) } catch {
            logger.warning("accounts did not answer ResolveUsernames", metadata: ["error": "\(error)"])
            throw RPCError.peerUnavailable("accounts")
        }
        try await remember(Array(response.usersByUsername.values))
        let erased = try await store.read { c in
            try Set(response.usersByUsername.values.map(\.userId).filter { try c.queryOne("SELECT 1 FROM erased_users WHERE id = ?", $0) != nil })
        }
        var found = cached
        var unknown: [String] = []
        for name in usernames where found[name] == nil {
            if let ref = response.usersByUsername[name], !erased.contains(ref.userId) { found[name] = ref } else { unknown.append(name) }
        }
        return (found, unknown)
    }

    /// The user a selector names, or NOT_FOUND naming `field`.
    func resolve(_ selector: SocialRules.Selector, field: String = "user") async throws -> Common_V1_UserRef {
        switch selector {
        case .id(let id):
            if let u = try await user(id: id) { return u }
            throw FieldErrors.single(.notFound, field: "\(field).user_id", "no such user")
        case .username(let name):
            if let u = try await users(usernames: [name]).found[name] { return u }
            throw FieldErrors.single(.notFound, field: "\(field).username", "no such user")
        }
    }

    /// Users whose login email is one of `emails` (accounts only: emails are not kept here).
    /// Nil when accounts cannot answer.
    func users(emails: [String]) async -> [String: Common_V1_UserRef]? {
        guard !emails.isEmpty else { return [:] }
        var request = Accounts_V1_ResolveEmailsRequest()
        request.emails = emails
        do { return try await accounts.resolveEmails(request, options: options).usersByEmail } catch {
            logger.warning("accounts did not answer ResolveEmails", metadata: ["error": "\(error)"])
            return nil
        }
    }

    /// Refreshes the cached names of `ids` in the background, one refresh at a time (a page asked
    /// while one runs is skipped: the next page asks again). Requests never wait for it.
    func refreshSoon(ids: [String]) {
        guard !ids.isEmpty, refreshing.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged else {
            return
        }
        Task {
            await refresh(ids: ids)
            refreshing.store(false, ordering: .releasing)
        }
    }

    /// Refreshes the cached names of `ids` from accounts if it answers in time (display names
    /// change); never fails (the cache stays as it is).
    func refresh(ids: [String]) async {
        let distinct = Array(Set(ids))
        guard !distinct.isEmpty else { return }
        for chunk in stride(from: 0, to: distinct.count, by: 200) {
            var request = Accounts_V1_GetUsersByIdsRequest()
            request.userIds = Array(distinct[chunk..<min(distinct.count, chunk + 200)])
            guard let response = try? await accounts.getUsersByIds(request, options: options) else { return }
            let known = request.userIds
            let changed =
                (try? await store.read { c in
                    try response.usersById.values.filter { r in
                        guard let row = try c.queryOne("SELECT display_name FROM users WHERE id = ?", r.userId) else {
                            return known.contains(r.userId)
                        }
                        return try row.get("display_name", as: String.self) != r.displayName
                    }
                }) ?? []
            try? await remember(Array(changed))
        }
    }
}
