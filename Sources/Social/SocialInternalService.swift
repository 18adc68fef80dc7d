import Contracts
import GRPCContracts
import RPCCore
import ServiceKit
import Storage
import Synchronization

/// `social.v1.SocialInternal`: what the other services ask (relationships, memberships, teams),
/// notifications they send, and account erasure. Only callers with the service credential get
/// in (the access interceptor). Event-driven calls (SendNotification, RecordTeamTaskCompleted,
/// EraseUser) come from outboxes that retry until OK: each applies its event once
/// (`ServiceStore.receiveOnce`) and answers OK for a target that no longer exists, so one
/// vanished team or user never blocks the sender's queue behind it.
public struct SocialInternalService: Social_V1_SocialInternalService {
    let core: SocialCore

    // MARK: Notifications

    public func sendNotification(
        request: Social_V1_SendNotificationRequest, context: ServerContext
    ) async throws -> Social_V1_SendNotificationResponse {
        var errors = FieldErrors()
        let eventID = FieldRules.eventID(request.eventId, into: &errors)
        let recipients = FieldRules.ids(request.recipientUserIds, field: "recipient_user_ids", minimum: 1, maximum: 100, into: &errors)
        switch request.kind {
        case .unspecified: errors.add("kind", "required")
        case .unrecognized: errors.add("kind", "unknown notification kind")
        default: break
        }
        let title = FieldRules.text(request.title, field: "title", 1...100, into: &errors)
        let body = FieldRules.text(request.body, field: "body", 0...500, multiline: true, into: &errors)
        let actorID = FieldRules.id(request.actorUserId, field: "actor_user_id", required: false, into: &errors)
        if request.data.count > 20 { errors.add("data", "at most 20 entries") }
        for (key, value) in request.data.sorted(by: { $0.key < $1.key }) {
            if !(1...64).contains(FieldRules.length(key)) || FieldRules.hasControlCharacters(key) {
                errors.add("data", "keys must be 1 to 64 characters without control characters")
            } else if FieldRules.length(value) > 500 {
                errors.add("data[\(key)]", "must be at most 500 characters")
            }
        }
        try errors.throwIfAny()

        // A redelivery answers from what the first delivery stored, without asking accounts.
        if let replay = try await replayed(eventID: eventID, recipients: recipients) { return replay }

        var wanted = recipients
        if !actorID.isEmpty { wanted.append(actorID) }
        let users = try await core.directory.users(ids: wanted)
        let actor = actorID.isEmpty ? nil : users[actorID]
        let known = recipients.filter { users[$0] != nil }
        var template = Inbox.Draft(
            kind: request.kind, title: title, body: body, actor: actor,
            target: request.hasTarget ? request.target : nil, data: request.data, eventID: eventID)
        if template.target?.target == nil { template.target = nil }
        let draft = template
        let now = core.now()
        let stored = Mutex<[String: String]>([:])
        let wasReplayed = try await core.receiveOncePublishing(eventID: eventID) { tx, out in
            var ids: [String: String] = [:]
            for r in known {
                if let id = try Inbox.store(tx, recipient: r, draft, now: now, out: &out) { ids[r] = id }
            }
            stored.withLock { $0 = ids }
        }
        if wasReplayed, let replay = try await replayed(eventID: eventID, recipients: recipients) { return replay }
        var response = Social_V1_SendNotificationResponse()
        response.notificationIds = stored.withLock { $0 }
        response.skippedUserIds = recipients.filter { response.notificationIds[$0] == nil }
        return response
    }

    /// The answer of an event seen before (`replayed` true), or nil.
    func replayed(eventID: String, recipients: [String]) async throws -> Social_V1_SendNotificationResponse? {
        try await core.store.read { c in
            guard try c.queryOne("SELECT 1 FROM inbox_processed WHERE event_id = ?", eventID) != nil else { return nil }
            var response = Social_V1_SendNotificationResponse()
            response.replayed = true
            for row in try c.query("SELECT recipient_id, id FROM notifications WHERE event_id = ?", eventID) {
                response.notificationIds[try row.get("recipient_id")] = try row.get("id")
            }
            response.skippedUserIds = recipients.filter { response.notificationIds[$0] == nil }
            return response
        }
    }

    // MARK: Relationships (one read each: they sit on other services' request paths)

    public func checkRelationship(
        request: Social_V1_CheckRelationshipRequest, context: ServerContext
    ) async throws -> Social_V1_CheckRelationshipResponse {
        var errors = FieldErrors()
        let a = FieldRules.id(request.userId, field: "user_id", into: &errors)
        let b = FieldRules.id(request.otherUserId, field: "other_user_id", into: &errors)
        if !a.isEmpty && a == b { errors.add("other_user_id", "must differ from user_id") }
        try errors.throwIfAny()
        let row = try await core.store.read { c in
            try c.queryOne(
                """
                SELECT EXISTS (SELECT 1 FROM friendships WHERE user_id = ?1 AND friend_id = ?2),
                       EXISTS (SELECT 1 FROM blocks WHERE blocker_id = ?1 AND blocked_id = ?2),
                       EXISTS (SELECT 1 FROM blocks WHERE blocker_id = ?2 AND blocked_id = ?1),
                       EXISTS (SELECT 1 FROM follows WHERE follower_id = ?1 AND followed_id = ?2),
                       EXISTS (SELECT 1 FROM follows WHERE follower_id = ?2 AND followed_id = ?1)
                """, a, b)!
        }
        var response = Social_V1_CheckRelationshipResponse()
        response.friends = try row.get(0)
        response.userBlocksOther = try row.get(1)
        response.otherBlocksUser = try row.get(2)
        response.userFollowsOther = try row.get(3)
        response.otherFollowsUser = try row.get(4)
        return response
    }

    public func listFollowedUserIds(
        request: Social_V1_ListFollowedUserIdsRequest, context: ServerContext
    ) async throws -> Social_V1_ListFollowedUserIdsResponse {
        var errors = FieldErrors()
        let user = FieldRules.id(request.userId, field: "user_id", into: &errors)
        if request.pageSize < 0 { errors.add("page_size", "must not be negative") }
        let size = request.pageSize > 0 ? min(1000, Int(request.pageSize)) : 500
        let filters = "followed-ids:\(user)"
        let cursor = core.pageTokens.cursor(request.pageToken, filters: filters, parts: 2, into: &errors)
        try errors.throwIfAny()
        let rows = try await core.store.read { c in
            try c.query(
                """
                SELECT followed_id, since FROM follows WHERE follower_id = ?1 AND (?2 IS NULL OR since > ?2 OR (since = ?2 AND followed_id > ?3))
                ORDER BY since, followed_id LIMIT ?4
                """, user, cursor.flatMap { Int64($0[0]) }, cursor?[1] ?? "", size + 1)
        }
        var response = Social_V1_ListFollowedUserIdsResponse()
        response.userIds = try rows.prefix(size).map { try $0.get("followed_id") }
        if rows.count > size {
            response.nextPageToken = core.pageTokens.make(
                cursor: [String(try rows[size - 1].get("since", as: Int64.self)), try rows[size - 1].get("followed_id")],
                filters: filters)
        }
        return response
    }

    public func checkHouseholdMembership(
        request: Social_V1_CheckHouseholdMembershipRequest, context: ServerContext
    ) async throws -> Social_V1_CheckHouseholdMembershipResponse {
        var errors = FieldErrors()
        let householdID = FieldRules.id(request.householdId, field: "household_id", into: &errors)
        let users = FieldRules.ids(request.userIds, field: "user_ids", minimum: 0, maximum: 50, into: &errors)
        try errors.throwIfAny()
        return try await core.store.read { c in
            guard let h = try c.queryOne("SELECT name, deleted_at FROM households WHERE id = ?", householdID) else {
                throw FieldErrors.single(.notFound, field: "household_id", "no such household")
            }
            var response = Social_V1_CheckHouseholdMembershipResponse()
            response.name = try h.get("name")
            response.state = try h.get("deleted_at", as: Int64?.self) == nil ? .active : .deleted
            var left: [String: Bool] = [:]
            for row in try c.query(
                "SELECT user_id, left_at IS NOT NULL AS gone FROM household_members WHERE household_id = ? ORDER BY join_seq", householdID)
            {
                let id: String = try row.get("user_id")
                let gone: Bool = try row.get("gone")
                left[id] = gone
                if !gone { response.memberUserIds.append(id) }
            }
            for u in users {
                response.memberships[u] =
                    switch left[u] {
                    case false?: .member
                    case true?: .formerMember
                    case nil: .notMember
                    }
            }
            return response
        }
    }

    // MARK: Teams

    public func getTeamOfUser(request: Social_V1_GetTeamOfUserRequest, context: ServerContext) async throws -> Social_V1_GetTeamOfUserResponse {
        var errors = FieldErrors()
        let user = FieldRules.id(request.userId, field: "user_id", into: &errors)
        try errors.throwIfAny()
        var response = Social_V1_GetTeamOfUserResponse()
        if let team = try await core.store.read({ c in try Teams.team(c, ofUser: user) }) { response.team = team }
        return response
    }

    public func recordTeamTaskCompleted(
        request: Social_V1_RecordTeamTaskCompletedRequest, context: ServerContext
    ) async throws -> Social_V1_RecordTeamTaskCompletedResponse {
        var errors = FieldErrors()
        let eventID = FieldRules.eventID(request.eventId, into: &errors)
        let teamID = FieldRules.id(request.teamId, field: "team_id", into: &errors)
        let taskID = FieldRules.id(request.taskId, field: "task_id", into: &errors)
        if !(1...100).contains(request.points) { errors.add("points", "must be 1 to 100") }
        try errors.throwIfAny()
        let now = core.now()
        let points = Int64(request.points)
        let counted = Mutex(false)
        let replayedEvent = try await core.store.receiveOnce(eventID: eventID) { tx in
            // A team deleted since (its last member left) or a task counted before: nothing changes.
            guard try tx.queryOne("SELECT 1 FROM teams WHERE id = ?", teamID) != nil else { return }
            try tx.execute(
                "INSERT OR IGNORE INTO team_task_completions (team_id, task_id, points, event_id, recorded_at) VALUES (?, ?, ?, ?, ?)",
                teamID, taskID, points, eventID, now)
            guard tx.changes == 1 else { return }
            try tx.execute("UPDATE teams SET score = score + ?, score_reached_at = ? WHERE id = ?", points, now, teamID)
            counted.withLock { $0 = true }
        }
        let score = try await core.store.read { c in try c.queryOne("SELECT score FROM teams WHERE id = ?", teamID)?.get(0, as: Int64.self) } ?? 0
        var response = Social_V1_RecordTeamTaskCompletedResponse()
        response.teamScore = score
        response.replayed = replayedEvent || !counted.withLock { $0 }
        return response
    }

    // MARK: Account deletion

    public func eraseUser(request: Social_V1_EraseUserRequest, context: ServerContext) async throws -> Social_V1_EraseUserResponse {
        let now = core.now()
        let replayed = try await EraseUser.receive(eventID: request.eventId, userID: request.userId, store: core.store) { tx, user in
            try Erasure.erase(tx, user: user, now: now)
        }
        core.hub.close(userID: request.userId, RPCError(.unauthenticated, "this account was deleted"))
        var response = Social_V1_EraseUserResponse()
        response.replayed = replayed
        return response
    }
}

enum Erasure {
    /// Everything social holds about `user`, as EraseUser describes: relations both ways, team
    /// and household memberships (an emptied team or household is deleted), inbox and settings,
    /// push targets; notifications others received keep their text and lose the actor.
    static func erase(_ tx: Transaction, user: String, now: Int64) throws {
        try tx.execute("DELETE FROM friendships WHERE user_id = ?1 OR friend_id = ?1", user)
        try tx.execute("DELETE FROM blocks WHERE blocker_id = ?1 OR blocked_id = ?1", user)
        try tx.execute("DELETE FROM follows WHERE follower_id = ?1 OR followed_id = ?1", user)
        try tx.execute("DELETE FROM follow_requests WHERE requester_id = ?1 OR target_id = ?1", user)
        if let team = try Teams.teamID(tx, ofUser: user) { _ = try Teams.leave(tx, userID: user, teamID: team) }
        for row in try tx.query(
            "SELECT m.household_id FROM household_members m JOIN households h ON h.id = m.household_id WHERE m.user_id = ? AND m.left_at IS NULL AND h.deleted_at IS NULL",
            user)
        {
            _ = try Households.removeMember(tx, householdID: try row.get(0), user: user, now: now, handOnChores: false)
        }
        try tx.execute("DELETE FROM notifications WHERE recipient_id = ?", user)
        try tx.execute("UPDATE notifications SET actor_id = NULL, actor_username = NULL, actor_display_name = NULL WHERE actor_id = ?", user)
        try tx.execute("DELETE FROM notification_settings WHERE user_id = ?", user)
        try tx.execute("DELETE FROM push_targets WHERE user_id = ?", user)
        try tx.execute("DELETE FROM users WHERE id = ?", user)
        try tx.execute("INSERT OR IGNORE INTO erased_users (id, erased_at) VALUES (?, ?)", user, now)
    }
}
