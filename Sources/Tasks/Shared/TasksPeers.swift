import Contracts
import Foundation
import Logging
import RPCCore
import ServiceKit
import Storage

/// The synchronous reads tasks makes of its peers, each with a short deadline and a clear answer
/// while the peer cannot be asked: accounts (usernames → users, ids → names) and social
/// (household memberships, a user's team). Writes to peers never happen here: they go through the
/// outbox.
final class TasksPeers: Sendable {
    let accounts: Accounts_V1_AccountsInternalClient
    let social: Social_V1_SocialInternalClient
    let deadline: Duration

    init(peers: PeerClients, deadline: Duration) {
        accounts = Accounts_V1_AccountsInternalClient(peers.client("accounts"))
        social = Social_V1_SocialInternalClient(peers.client("social"))
        self.deadline = deadline
    }

    var options: CallOptions { CallOptions(timeout: deadline) }

    /// UNAVAILABLE naming the peer and what could not be done, for a peer that did not answer in
    /// time (or answered with an error of its own, which is logged by the caller's server).
    static func unavailable(_ peer: String, _ what: String, _ error: Error) -> RPCError {
        RPCError(.unavailable, "\(peer) cannot be reached right now, so \(what): try again shortly", cause: error)
    }

    /// Usernames → users (case-insensitive; accounts answers by the name as asked).
    func resolveUsernames(_ names: [String]) async throws -> (found: [String: Common_V1_UserRef], unknown: Set<String>) {
        guard !names.isEmpty else { return ([:], []) }
        var r = Accounts_V1_ResolveUsernamesRequest()
        r.usernames = names
        do {
            let answer = try await accounts.resolveUsernames(r, options: options)
            return (answer.usersByUsername, Set(answer.unknownUsernames))
        } catch {
            throw Self.unavailable("accounts", "the participants' usernames cannot be checked and nothing was created", error)
        }
    }

    /// Ids → users; unknown (or deleted) ids are missing from the answer.
    func usersByIds(_ ids: [String]) async throws -> [String: Common_V1_UserRef] {
        guard !ids.isEmpty else { return [:] }
        var r = Accounts_V1_GetUsersByIdsRequest()
        r.userIds = ids
        return try await accounts.getUsersByIds(r, options: options).usersById
    }

    /// The creator's team id ("" when in no team).
    func teamOf(_ user: String) async throws -> String {
        var r = Social_V1_GetTeamOfUserRequest()
        r.userId = user
        do { return try await social.getTeamOfUser(r, options: options).team.teamId } catch {
            throw Self.unavailable("social", "the creator's team (which scores the task) cannot be looked up and nothing was created", error)
        }
    }

    /// A household's membership answer for `users` (nil: no such household). Never cached: a
    /// removed housemate loses the household's chores the moment social answers so.
    func membership(household: String, users: [String]) async throws -> Social_V1_CheckHouseholdMembershipResponse? {
        var r = Social_V1_CheckHouseholdMembershipRequest()
        r.householdId = household
        r.userIds = users
        do { return try await social.checkHouseholdMembership(r, options: options) } catch let e as RPCError where e.code == .notFound {
            return nil
        } catch {
            throw Self.unavailable("social", "household membership cannot be checked", error)
        }
    }

    /// Whether `user` may read `owner`'s habits: `user` follows `owner` and neither blocks the
    /// other (social's CheckRelationship). UNAVAILABLE while social cannot answer.
    func follows(_ user: String, _ owner: String) async throws -> Bool {
        var r = Social_V1_CheckRelationshipRequest()
        r.userId = user
        r.otherUserId = owner
        do {
            let a = try await social.checkRelationship(r, options: options)
            return a.userFollowsOther && !a.userBlocksOther && !a.otherBlocksUser
        } catch {
            throw Self.unavailable("social", "whom you follow cannot be checked", error)
        }
    }

    /// The users `user` follows, oldest follow first, at most `limit` (social's
    /// ListFollowedUserIds, page by page). Social drops follows in both directions when one user
    /// blocks the other, so blocked users are never among them. UNAVAILABLE while social cannot
    /// answer.
    func followed(by user: String, limit: Int) async throws -> [String] {
        var out: [String] = []
        var r = Social_V1_ListFollowedUserIdsRequest()
        r.userId = user
        r.pageSize = 500
        do {
            repeat {
                let a = try await social.listFollowedUserIds(r, options: options)
                out += a.userIds
                r.pageToken = a.nextPageToken
            } while !r.pageToken.isEmpty && out.count < limit
        } catch {
            throw Self.unavailable("social", "whom you follow cannot be looked up", error)
        }
        return Array(out.prefix(limit))
    }

    /// NOT_FOUND unless `user` is (or, for a deleted household, was at deletion) a member; the
    /// answer's state otherwise.
    @discardableResult
    func requireMember(household: String, user: String, what: String = "no such household") async throws -> Social_V1_HouseholdState {
        guard let answer = try await membership(household: household, users: [user]), answer.memberships[user] == .member else {
            throw RPCError(.notFound, what)
        }
        return answer.state
    }
}

/// The names tasks shows for user ids: kept in the `users` table (written when a user first
/// appears, from accounts' answer), refreshed from accounts when older than `refreshAfter`. While
/// accounts cannot answer, the kept names are shown (a name may be a little out of date; never
/// missing). Erased users are removed and shown as "deleted-user".
final class UserDirectory: Sendable {
    let store: ServiceStore
    let peers: TasksPeers
    let refreshAfter: Duration
    let clock: any WallClock
    let logger: Logger

    init(store: ServiceStore, peers: TasksPeers, refreshAfter: Duration, clock: any WallClock, logger: Logger) {
        self.store = store
        self.peers = peers
        self.refreshAfter = refreshAfter
        self.clock = clock
        self.logger = logger
    }

    static let deletedUsername = "deleted-user"

    /// How an erased (or unknown) user is shown.
    static var deleted: Common_V1_UserRef {
        var r = Common_V1_UserRef()
        r.username = deletedUsername
        return r
    }

    /// The kept names of `ids` (missing ones absent).
    static func cached(_ db: some SQLReader, _ ids: some Collection<String>) throws -> [String: Common_V1_UserRef] {
        try cached(db, ids, staleBefore: nil).refs
    }

    /// The kept names of `ids`, and which of them were refreshed before `staleBefore`.
    static func cached(
        _ db: some SQLReader, _ ids: some Collection<String>, staleBefore: Int64?
    ) throws -> (
        refs: [String: Common_V1_UserRef], stale: [String]
    ) {
        var out: [String: Common_V1_UserRef] = [:]
        var stale: [String] = []
        let unique = Array(Set(ids))
        var i = 0
        while i < unique.count {
            let chunk = Array(unique[i..<min(i + 500, unique.count)])
            i += 500
            let marks = Array(repeating: "?", count: chunk.count).joined(separator: ",")
            for row in try db.query(
                "SELECT user_id, username, display_name, refreshed_at FROM users WHERE user_id IN (\(marks))",
                arguments: chunk.map { .text($0) })
            {
                var r = Common_V1_UserRef()
                r.userId = try row.get("user_id")
                r.username = try row.get("username")
                r.displayName = try row.get("display_name")
                out[r.userId] = r
                if let staleBefore, try row.get("refreshed_at", as: Int64.self) < staleBefore { stale.append(r.userId) }
            }
        }
        return (out, stale)
    }

    /// The moment before which a kept name is stale.
    var staleBefore: Int64 { clock.nowMilliseconds() - refreshAfter.milliseconds }

    /// Keeps `refs` (in the caller's write transaction).
    static func remember(_ tx: Transaction, _ refs: some Sequence<Common_V1_UserRef>, now: Int64) throws {
        for r in refs where !r.userId.isEmpty {
            try tx.execute(
                """
                INSERT INTO users (user_id, username, display_name, refreshed_at) VALUES (?, ?, ?, ?)
                ON CONFLICT (user_id) DO UPDATE SET username = excluded.username, display_name = excluded.display_name,
                    refreshed_at = excluded.refreshed_at
                """, r.userId, r.username, r.displayName, now)
        }
    }

    /// Fresh names of `ids` for a write that is about to add them: kept ones younger than
    /// `refreshAfter`, the rest from accounts (UNAVAILABLE while accounts cannot answer and a name
    /// is not kept). Unknown ids are absent from the answer.
    func lookUp(_ ids: [String]) async throws -> [String: Common_V1_UserRef] {
        let now = clock.nowMilliseconds(), staleBefore = self.staleBefore
        let (kept, stale) = try await store.read { c in try Self.cached(c, ids, staleBefore: staleBefore) }
        let missing = Set(ids.filter { kept[$0] == nil }).union(stale)
        guard !missing.isEmpty else { return kept }
        do {
            let found = try await peers.usersByIds(Array(missing))
            try await store.write { tx in try Self.remember(tx, found.values, now: now) }
            return kept.merging(found) { _, new in new }
        } catch {
            if missing.allSatisfy({ kept[$0] != nil }) { return kept }
            throw TasksPeers.unavailable("accounts", "the users' names cannot be looked up", error)
        }
    }

    /// Refreshes stale names in the background of a read (best effort: a failure keeps the old).
    func refreshIfStale(_ stale: [String]) {
        guard !stale.isEmpty else { return }
        let now = clock.nowMilliseconds()
        let store = self.store, peers = self.peers, logger = self.logger
        Task {
            do {
                let found = try await peers.usersByIds(stale)
                try await store.write { tx in
                    // Only users still kept (an erasure in between must not bring a name back).
                    for r in found.values where try tx.queryOne("SELECT 1 FROM users WHERE user_id = ?", r.userId) != nil {
                        try Self.remember(tx, [r], now: now)
                    }
                }
            } catch {
                logger.debug("names not refreshed", metadata: ["error": "\(error)"])
            }
        }
    }
}

extension Dictionary where Key == String, Value == Common_V1_UserRef {
    /// The reference of `id`, "deleted-user" when erased (nil id) or unknown.
    func ref(_ id: String?) -> Common_V1_UserRef {
        guard let id, let r = self[id] else { return UserDirectory.deleted }
        return r
    }
}
