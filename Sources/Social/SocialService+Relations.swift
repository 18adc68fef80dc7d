import Contracts
import GRPCContracts
import RPCCore
import ServiceKit
import Storage

// MARK: Friends, blocks (seed E) and follows (seed C)

extension SocialService {
    /// The other user of a relation request: validated, resolved (NOT_FOUND), not the caller.
    func other(_ selector: Social_V1_UserSelector?, hasSelector: Bool, caller: CallerIdentity) async throws -> Common_V1_UserRef {
        var errors = FieldErrors()
        let s = SocialRules.selector(hasSelector ? selector : nil, into: &errors)
        try errors.throwIfAny()
        let user = try await core.directory.resolve(s!)
        if user.userId == caller.userID { throw FieldErrors.single(.invalidArgument, field: "user", "cannot be yourself") }
        return user
    }

    static func blockedEitherWay(_ db: some SQLReader, _ a: String, _ b: String) throws -> Bool {
        try db.queryOne("SELECT 1 FROM blocks WHERE (blocker_id = ?1 AND blocked_id = ?2) OR (blocker_id = ?2 AND blocked_id = ?1)", a, b) != nil
    }

    static let blockedMessage = "not possible between you and this user"

    /// NOT_FOUND when `user` was erased after the caller's lookup and before this write.
    static func requireNotErased(_ tx: Transaction, _ user: String) throws {
        if try tx.queryOne("SELECT 1 FROM erased_users WHERE id = ?", user) != nil {
            throw FieldErrors.single(.notFound, field: "user", "no such user")
        }
    }

    public func addFriend(request: Social_V1_AddFriendRequest, context: ServerContext) async throws -> Social_V1_AddFriendResponse {
        let caller = try core.caller(context)
        let other = try await other(request.user, hasSelector: request.hasUser, caller: caller)
        let me = try await me(caller)
        let now = core.now()
        let since = try await core.writePublishing { tx, out -> Int64 in
            try Self.requireNotErased(tx, other.userId)
            if try Self.blockedEitherWay(tx, me.userId, other.userId) { throw RPCError(.permissionDenied, Self.blockedMessage) }
            if try tx.queryOne("SELECT 1 FROM friendships WHERE user_id = ? AND friend_id = ?", me.userId, other.userId) != nil {
                throw FieldErrors.single(.alreadyExists, field: "user", "already friends")
            }
            try tx.execute(
                "INSERT INTO friendships (user_id, friend_id, since) VALUES (?, ?, ?), (?, ?, ?)",
                me.userId, other.userId, now, other.userId, me.userId, now)
            var target = Social_V1_NotificationTarget()
            target.userId = me.userId
            _ = try Inbox.store(
                tx, recipient: other.userId,
                .init(kind: .friendAdded, title: "\(Self.name(me)) added you as a friend", actor: me, target: target, collapsesUnread: true),
                now: now, out: &out)
            return now
        }
        var response = Social_V1_AddFriendResponse()
        response.friendship.user = other
        response.friendship.since = Google_Protobuf_Timestamp(milliseconds: since)
        return response
    }

    public func removeFriend(request: Social_V1_RemoveFriendRequest, context: ServerContext) async throws -> Social_V1_RemoveFriendResponse {
        let caller = try core.caller(context)
        let other = try await other(request.user, hasSelector: request.hasUser, caller: caller)
        try await core.store.write { tx in
            try tx.execute(
                "DELETE FROM friendships WHERE (user_id = ?1 AND friend_id = ?2) OR (user_id = ?2 AND friend_id = ?1)",
                caller.userID, other.userId)
            if tx.changes == 0 { throw FieldErrors.single(.notFound, field: "user", "not your friend") }
        }
        return Social_V1_RemoveFriendResponse()
    }

    public func listFriends(request: Social_V1_ListFriendsRequest, context: ServerContext) async throws -> Social_V1_ListFriendsResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let size = FieldRules.pageSize(request.pageSize, into: &errors)
        let cursor = core.pageTokens.cursor(request.pageToken, filters: "friends", parts: 2, into: &errors)
        try errors.throwIfAny()
        let rows = try await core.store.read { c in
            try c.query(
                """
                SELECT u.id, u.username, u.display_name, u.username_key, f.since FROM friendships f JOIN users u ON u.id = f.friend_id
                WHERE f.user_id = ?1 AND (u.username_key > ?2 OR (u.username_key = ?2 AND u.id > ?3))
                ORDER BY u.username_key, u.id LIMIT ?4
                """, caller.userID, cursor?[0] ?? "", cursor?[1] ?? "", size + 1)
        }
        var response = Social_V1_ListFriendsResponse()
        response.friends = try rows.prefix(size).map { row in
            var f = Social_V1_Friend()
            f.user = try UserDirectory.ref(row)
            f.since = Google_Protobuf_Timestamp(milliseconds: try row.get("since"))
            return f
        }
        if rows.count > size {
            response.nextPageToken = core.pageTokens.make(
                cursor: [try rows[size - 1].get("username_key"), try rows[size - 1].get("id")], filters: "friends")
        }
        await refreshNames(&response.friends, \.user)
        return response
    }

    /// A page answers from the cached names; they are refreshed from accounts in the background
    /// (display names change), so the answer never waits on accounts.
    func refreshNames<T>(_ items: inout [T], _ path: WritableKeyPath<T, Common_V1_UserRef>) async {
        core.directory.refreshSoon(ids: items.map { $0[keyPath: path].userId })
    }

    public func blockUser(request: Social_V1_BlockUserRequest, context: ServerContext) async throws -> Social_V1_BlockUserResponse {
        let caller = try core.caller(context)
        let other = try await other(request.user, hasSelector: request.hasUser, caller: caller)
        let now = core.now()
        try await core.store.write { tx in
            if try Inbox.blocks(tx, blocker: caller.userID, blocked: other.userId) {
                throw FieldErrors.single(.alreadyExists, field: "user", "already blocked")
            }
            try tx.execute("INSERT INTO blocks (blocker_id, blocked_id, created_at) VALUES (?, ?, ?)", caller.userID, other.userId, now)
            // Friendship, follows and follow requests end, both ways.
            try tx.execute(
                "DELETE FROM friendships WHERE (user_id = ?1 AND friend_id = ?2) OR (user_id = ?2 AND friend_id = ?1)",
                caller.userID, other.userId)
            try tx.execute(
                "DELETE FROM follows WHERE (follower_id = ?1 AND followed_id = ?2) OR (follower_id = ?2 AND followed_id = ?1)",
                caller.userID, other.userId)
            try tx.execute(
                "DELETE FROM follow_requests WHERE (requester_id = ?1 AND target_id = ?2) OR (requester_id = ?2 AND target_id = ?1)",
                caller.userID, other.userId)
        }
        var response = Social_V1_BlockUserResponse()
        response.blocked.user = other
        response.blocked.blockedAt = Google_Protobuf_Timestamp(milliseconds: now)
        return response
    }

    public func unblockUser(request: Social_V1_UnblockUserRequest, context: ServerContext) async throws -> Social_V1_UnblockUserResponse {
        let caller = try core.caller(context)
        let other = try await other(request.user, hasSelector: request.hasUser, caller: caller)
        try await core.store.write { tx in
            try tx.execute("DELETE FROM blocks WHERE blocker_id = ? AND blocked_id = ?", caller.userID, other.userId)
            if tx.changes == 0 { throw FieldErrors.single(.notFound, field: "user", "not blocked") }
        }
        return Social_V1_UnblockUserResponse()
    }

    public func listBlockedUsers(
        request: Social_V1_ListBlockedUsersRequest, context: ServerContext
    ) async throws -> Social_V1_ListBlockedUsersResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let size = FieldRules.pageSize(request.pageSize, into: &errors)
        let cursor = core.pageTokens.cursor(request.pageToken, filters: "blocked", parts: 2, into: &errors)
        try errors.throwIfAny()
        let rows = try await core.store.read { c in
            try c.query(
                """
                SELECT b.blocked_id AS other, b.created_at AS at, u.id, u.username, u.display_name FROM blocks b LEFT JOIN users u ON u.id = b.blocked_id
                WHERE b.blocker_id = ?1 AND (?2 IS NULL OR b.created_at < ?2 OR (b.created_at = ?2 AND b.blocked_id < ?3))
                ORDER BY b.created_at DESC, b.blocked_id DESC LIMIT ?4
                """, caller.userID, cursor.flatMap { Int64($0[0]) }, cursor?[1] ?? "", size + 1)
        }
        var response = Social_V1_ListBlockedUsersResponse()
        response.blocked = try rows.prefix(size).map { row in
            var b = Social_V1_BlockedUser()
            b.user = try Self.ref(row)
            b.blockedAt = Google_Protobuf_Timestamp(milliseconds: try row.get("at"))
            return b
        }
        if rows.count > size {
            response.nextPageToken = core.pageTokens.make(
                cursor: [String(try rows[size - 1].get("at", as: Int64.self)), try rows[size - 1].get("other")],
                filters: "blocked")
        }
        await refreshNames(&response.blocked, \.user)
        return response
    }

    /// A row with `other` and optional cached user columns.
    static func ref(_ row: Row) throws -> Common_V1_UserRef {
        if try row.get("id", as: String?.self) != nil { return try UserDirectory.ref(row) }
        var r = Common_V1_UserRef()
        r.userId = try row.get("other")
        return r
    }

    // MARK: Follows

    public func requestFollow(request: Social_V1_RequestFollowRequest, context: ServerContext) async throws -> Social_V1_RequestFollowResponse {
        let caller = try core.caller(context)
        let other = try await other(request.user, hasSelector: request.hasUser, caller: caller)
        let me = try await me(caller)
        let now = core.now()
        try await core.writePublishing { tx, out in
            try Self.requireNotErased(tx, other.userId)
            if try Self.blockedEitherWay(tx, me.userId, other.userId) { throw RPCError(.permissionDenied, Self.blockedMessage) }
            if try tx.queryOne("SELECT 1 FROM follows WHERE follower_id = ? AND followed_id = ?", me.userId, other.userId) != nil {
                throw FieldErrors.single(.alreadyExists, field: "user", "already following")
            }
            if try tx.queryOne("SELECT 1 FROM follow_requests WHERE requester_id = ? AND target_id = ?", me.userId, other.userId) != nil {
                throw FieldErrors.single(.alreadyExists, field: "user", "a request to follow this user is already pending")
            }
            try tx.execute("INSERT INTO follow_requests (requester_id, target_id, created_at) VALUES (?, ?, ?)", me.userId, other.userId, now)
            var target = Social_V1_NotificationTarget()
            target.userId = me.userId
            _ = try Inbox.store(
                tx, recipient: other.userId,
                .init(kind: .followRequest, title: "\(Self.name(me)) asks to follow you", actor: me, target: target, collapsesUnread: true),
                now: now, out: &out)
        }
        var response = Social_V1_RequestFollowResponse()
        response.request.requester = me
        response.request.target = other
        response.request.createdAt = Google_Protobuf_Timestamp(milliseconds: now)
        return response
    }

    public func acceptFollowRequest(
        request: Social_V1_AcceptFollowRequestRequest, context: ServerContext
    ) async throws -> Social_V1_AcceptFollowRequestResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let requester = FieldRules.id(request.requesterUserId, field: "requester_user_id", into: &errors)
        try errors.throwIfAny()
        let me = try await me(caller)
        let now = core.now()
        try await core.writePublishing { tx, out in
            try tx.execute("DELETE FROM follow_requests WHERE requester_id = ? AND target_id = ?", requester, me.userId)
            if tx.changes == 0 { throw FieldErrors.single(.notFound, field: "requester_user_id", "no pending request from this user") }
            try tx.execute("INSERT OR IGNORE INTO follows (follower_id, followed_id, since) VALUES (?, ?, ?)", requester, me.userId, now)
            var target = Social_V1_NotificationTarget()
            target.userId = me.userId
            _ = try Inbox.store(
                tx, recipient: requester,
                .init(kind: .followAccepted, title: "\(Self.name(me)) accepted your follow request", actor: me, target: target),
                now: now, out: &out)
        }
        var response = Social_V1_AcceptFollowRequestResponse()
        response.follower.user =
            (try? await core.directory.user(id: requester)) ?? nil
            ?? {
                var r = Common_V1_UserRef()
                r.userId = requester
                return r
            }()
        response.follower.since = Google_Protobuf_Timestamp(milliseconds: now)
        return response
    }

    public func declineFollowRequest(
        request: Social_V1_DeclineFollowRequestRequest, context: ServerContext
    ) async throws -> Social_V1_DeclineFollowRequestResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let requester = FieldRules.id(request.requesterUserId, field: "requester_user_id", into: &errors)
        try errors.throwIfAny()
        try await core.store.write { tx in
            try tx.execute("DELETE FROM follow_requests WHERE requester_id = ? AND target_id = ?", requester, caller.userID)
            if tx.changes == 0 { throw FieldErrors.single(.notFound, field: "requester_user_id", "no pending request from this user") }
        }
        return Social_V1_DeclineFollowRequestResponse()
    }

    public func unfollow(request: Social_V1_UnfollowRequest, context: ServerContext) async throws -> Social_V1_UnfollowResponse {
        let caller = try core.caller(context)
        let other = try await other(request.user, hasSelector: request.hasUser, caller: caller)
        try await core.store.write { tx in
            try tx.execute("DELETE FROM follows WHERE follower_id = ? AND followed_id = ?", caller.userID, other.userId)
            let followed = tx.changes
            try tx.execute("DELETE FROM follow_requests WHERE requester_id = ? AND target_id = ?", caller.userID, other.userId)
            if followed + tx.changes == 0 { throw FieldErrors.single(.notFound, field: "user", "neither following nor requested") }
        }
        return Social_V1_UnfollowResponse()
    }

    /// A page of follows, most recent first; `mine` is the column of the caller, `theirs` the other.
    func follows(
        _ caller: String, mine: String, theirs: String, size: Int, token: String, filters: String,
        into errors: inout FieldErrors
    ) async throws -> ([Social_V1_Follow], String) {
        let cursor = core.pageTokens.cursor(token, filters: filters, parts: 2, into: &errors)
        try errors.throwIfAny()
        let rows = try await core.store.read { c in
            try c.query(
                """
                SELECT f.\(theirs) AS other, f.since AS at, u.id, u.username, u.display_name FROM follows f LEFT JOIN users u ON u.id = f.\(theirs)
                WHERE f.\(mine) = ?1 AND (?2 IS NULL OR f.since < ?2 OR (f.since = ?2 AND f.\(theirs) < ?3))
                ORDER BY f.since DESC, f.\(theirs) DESC LIMIT ?4
                """, caller, cursor.flatMap { Int64($0[0]) }, cursor?[1] ?? "", size + 1)
        }
        var list = try rows.prefix(size).map { row in
            var f = Social_V1_Follow()
            f.user = try Self.ref(row)
            f.since = Google_Protobuf_Timestamp(milliseconds: try row.get("at"))
            return f
        }
        await refreshNames(&list, \.user)
        let next =
            rows.count > size
            ? core.pageTokens.make(cursor: [String(try rows[size - 1].get("at", as: Int64.self)), try rows[size - 1].get("other")], filters: filters)
            : ""
        return (list, next)
    }

    public func listFollowers(request: Social_V1_ListFollowersRequest, context: ServerContext) async throws -> Social_V1_ListFollowersResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let size = FieldRules.pageSize(request.pageSize, into: &errors)
        let (list, next) = try await follows(
            caller.userID, mine: "followed_id", theirs: "follower_id", size: size, token: request.pageToken,
            filters: "followers", into: &errors)
        var response = Social_V1_ListFollowersResponse()
        response.followers = list
        response.nextPageToken = next
        return response
    }

    public func listFollowing(request: Social_V1_ListFollowingRequest, context: ServerContext) async throws -> Social_V1_ListFollowingResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let size = FieldRules.pageSize(request.pageSize, into: &errors)
        let (list, next) = try await follows(
            caller.userID, mine: "follower_id", theirs: "followed_id", size: size, token: request.pageToken,
            filters: "following", into: &errors)
        var response = Social_V1_ListFollowingResponse()
        response.following = list
        response.nextPageToken = next
        return response
    }

    public func listFollowRequests(
        request: Social_V1_ListFollowRequestsRequest, context: ServerContext
    ) async throws -> Social_V1_ListFollowRequestsResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let size = FieldRules.pageSize(request.pageSize, into: &errors)
        let outgoing: Bool
        switch request.direction {
        case .unspecified, .incoming: outgoing = false
        case .outgoing: outgoing = true
        case .unrecognized: errors.add("direction", "unknown direction"); outgoing = false
        }
        let filters = outgoing ? "follow-requests-out" : "follow-requests-in"
        let cursor = core.pageTokens.cursor(request.pageToken, filters: filters, parts: 2, into: &errors)
        try errors.throwIfAny()
        let (mine, theirs) = outgoing ? ("requester_id", "target_id") : ("target_id", "requester_id")
        let rows = try await core.store.read { c in
            try c.query(
                """
                SELECT r.requester_id, r.target_id, r.\(theirs) AS other, r.created_at AS at FROM follow_requests r
                WHERE r.\(mine) = ?1 AND (?2 IS NULL OR r.created_at < ?2 OR (r.created_at = ?2 AND r.\(theirs) < ?3))
                ORDER BY r.created_at DESC, r.\(theirs) DESC LIMIT ?4
                """, caller.userID, cursor.flatMap { Int64($0[0]) }, cursor?[1] ?? "", size + 1)
        }
        let page = Array(rows.prefix(size))
        let ids = try page.flatMap { [try $0.get("requester_id", as: String.self), try $0.get("target_id", as: String.self)] }
        core.directory.refreshSoon(ids: ids)
        let refs = try await core.store.read { c in try UserDirectory.cached(c, ids: ids) }
        func ref(_ id: String) -> Common_V1_UserRef {
            if let r = refs[id] { return r }
            var r = Common_V1_UserRef()
            r.userId = id
            return r
        }
        var response = Social_V1_ListFollowRequestsResponse()
        response.requests = try page.map { row in
            var r = Social_V1_FollowRequest()
            r.requester = ref(try row.get("requester_id"))
            r.target = ref(try row.get("target_id"))
            r.createdAt = Google_Protobuf_Timestamp(milliseconds: try row.get("at"))
            return r
        }
        if rows.count > size {
            response.nextPageToken = core.pageTokens.make(
                cursor: [String(try rows[size - 1].get("at", as: Int64.self)), try rows[size - 1].get("other")],
                filters: filters)
        }
        return response
    }
}
