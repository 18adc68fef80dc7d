import Contracts
import GRPCContracts
import RPCCore
import ServiceKit
import Storage

// MARK: Households (seed B)

extension SocialService {
    public func createHousehold(request: Social_V1_CreateHouseholdRequest, context: ServerContext) async throws -> Social_V1_CreateHouseholdResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let name = SocialRules.name(request.name, into: &errors)
        if request.inviteEmails.count > 20 { errors.add("invite_emails", "at most 20 addresses") }
        var emails: [String] = []
        var seen = Set<String>()
        for (i, raw) in request.inviteEmails.prefix(20).enumerated() {
            let e = FieldRules.email(raw, field: "invite_emails[\(i)]", into: &errors)
            if !e.isEmpty, FieldRules.isWellFormedEmail(e), seen.insert(FieldRules.key(e)).inserted { emails.append(e) }
        }
        FieldRules.idempotencyKey(request.idempotencyKey, required: false, into: &errors)
        try errors.throwIfAny()
        let retry = Self.retryKey("CreateHousehold", caller: caller, key: request.idempotencyKey, request: request)
        if let earlier = try await storedAnswer(retry, as: Social_V1_CreateHouseholdResponse.self) { return earlier }

        let me = try await me(caller)
        let invited = emails
        let users = await core.directory.users(emails: invited) ?? [:]
        let now = core.now()
        let householdID = ULID.make(now: now)
        let limits = core.configuration
        return try await core.writePublishing { tx, out -> Social_V1_CreateHouseholdResponse in
            try tx.once(retry, now: now) {
                try Households.checkRoomForAnother(tx, user: me.userId, limit: limits.maxHouseholdsPerUser)
                try tx.execute(
                    "INSERT INTO households (id, name, created_by, created_at, next_join_seq) VALUES (?, ?, ?, ?, 2)",
                    householdID, name, me.userId, now)
                try tx.execute(
                    "INSERT INTO household_members (household_id, user_id, join_seq, joined_at) VALUES (?, ?, 1, ?)",
                    householdID, me.userId, now)
                try Households.checkMailQuota(tx, inviter: me.userId, emails: invited, field: "invite_emails", now: now, limits: limits)
                var invites: [Social_V1_HouseholdInvite] = []
                for email in invited {
                    invites.append(
                        try Households.invite(
                            tx, householdID: householdID, householdName: name, email: email, by: me,
                            invitee: users[email], now: now, lifetime: limits.inviteLifetime, out: &out))
                }
                var response = Social_V1_CreateHouseholdResponse()
                response.household = try Households.household(tx, id: householdID)!
                response.invites = invites
                return response
            }
        }
    }

    public func joinHousehold(request: Social_V1_JoinHouseholdRequest, context: ServerContext) async throws -> Social_V1_JoinHouseholdResponse {
        let caller = try core.caller(context)
        let typed = FieldRules.trimmed(request.inviteCode)
        if typed.isEmpty { throw FieldErrors.single(.invalidArgument, field: "invite_code", "required") }
        guard FieldRules.length(typed) <= 32, let code = InviteCode.normalise(typed) else {
            throw FieldErrors.single(.invalidArgument, field: "invite_code", "is not an invite code (8 characters, like K7P2-9XQM)")
        }
        // A guess is counted before the code is looked up (atomically, per caller and address), and
        // released when the code exists: only unknown codes count against the limits.
        let attempt: [SlidingWindowThrottle.Reservation]
        switch SlidingWindowThrottle.reserveAll([(core.guessesByUser, caller.userID), (core.guessesByAddress, context.clientAddress)]) {
        case .success(let r): attempt = r
        case .failure(let wait): throw RPCError.throttled("too many wrong invite codes", wait: wait)
        }
        let known = try? await core.store.read { c in try c.queryOne("SELECT 1 FROM household_invites WHERE code = ?", code) != nil }
        if known != false { for r in attempt { r.release() } }
        guard known == true else {
            if known == nil { throw RPCError(.unavailable, "the invite could not be checked now: try again") }
            throw FieldErrors.single(.notFound, field: "invite_code", "no such invite code")
        }

        let me = try await me(caller)
        let now = core.now()
        let limits = core.configuration
        let household = try await core.writePublishing { tx, out -> Social_V1_Household in
            guard
                let invite = try tx.queryOne(
                    "SELECT i.household_id, i.expires_at, i.used_at, i.revoked_at, h.deleted_at, h.name FROM household_invites i JOIN households h ON h.id = i.household_id WHERE i.code = ?",
                    code)
            else { throw FieldErrors.single(.notFound, field: "invite_code", "no such invite code") }
            let householdID: String = try invite.get("household_id")
            if try Households.isMember(tx, householdID: householdID, user: me.userId), try invite.get("deleted_at", as: Int64?.self) == nil {
                throw RPCError(.alreadyExists, "you are already a member of this household")
            }
            if try invite.get("deleted_at", as: Int64?.self) != nil {
                throw FieldErrors.single(.failedPrecondition, field: "invite_code", "this household was deleted")
            }
            if try invite.get("used_at", as: Int64?.self) != nil {
                throw FieldErrors.single(.failedPrecondition, field: "invite_code", "this invite code was already used")
            }
            if try invite.get("revoked_at", as: Int64?.self) != nil {
                throw FieldErrors.single(.failedPrecondition, field: "invite_code", "this invite code was replaced by a newer one")
            }
            if try invite.get("expires_at", as: Int64.self) <= now {
                throw FieldErrors.single(.failedPrecondition, field: "invite_code", "this invite code expired: ask for a new one")
            }
            let members = try Households.memberIDs(tx, householdID: householdID)
            if members.count >= limits.maxHouseholdMembers {
                throw FieldErrors.single(.failedPrecondition, field: "invite_code", "this household is full (\(limits.maxHouseholdMembers) members)")
            }
            try Households.checkRoomForAnother(tx, user: me.userId, limit: limits.maxHouseholdsPerUser)
            try tx.execute("UPDATE household_invites SET used_at = ?, used_by = ? WHERE code = ?", now, me.userId, code)
            try Households.addMember(tx, householdID: householdID, user: me.userId, now: now)
            let name: String = try invite.get("name")
            var target = Social_V1_NotificationTarget()
            target.householdId = householdID
            for member in members {
                _ = try Inbox.store(
                    tx, recipient: member,
                    .init(
                        kind: .householdJoined, title: "\(Self.name(me)) joined \(name)", actor: me, target: target,
                        data: ["household_name": name]), now: now, out: &out)
            }
            return try Households.household(tx, id: householdID)!
        }
        var response = Social_V1_JoinHouseholdResponse()
        response.household = household
        return response
    }

    public func renameHousehold(request: Social_V1_RenameHouseholdRequest, context: ServerContext) async throws -> Social_V1_RenameHouseholdResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let householdID = FieldRules.id(request.householdId, field: "household_id", into: &errors)
        let name = SocialRules.name(request.name, into: &errors)
        try errors.throwIfAny()
        let household = try await core.store.write { tx -> Social_V1_Household in
            try Households.requireMember(tx, householdID: householdID, user: caller.userID)
            try tx.execute("UPDATE households SET name = ? WHERE id = ?", name, householdID)
            return try Households.household(tx, id: householdID)!
        }
        var response = Social_V1_RenameHouseholdResponse()
        response.household = household
        return response
    }

    public func deleteHousehold(request: Social_V1_DeleteHouseholdRequest, context: ServerContext) async throws -> Social_V1_DeleteHouseholdResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let householdID = FieldRules.id(request.householdId, field: "household_id", into: &errors)
        try errors.throwIfAny()
        let now = core.now()
        try await core.store.write { tx in
            try Households.requireMember(tx, householdID: householdID, user: caller.userID)
            try Households.delete(tx, householdID: householdID, now: now)
        }
        return Social_V1_DeleteHouseholdResponse()
    }

    public func inviteHousemate(request: Social_V1_InviteHousemateRequest, context: ServerContext) async throws -> Social_V1_InviteHousemateResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let householdID = FieldRules.id(request.householdId, field: "household_id", into: &errors)
        let email = FieldRules.email(request.email, into: &errors)
        FieldRules.idempotencyKey(request.idempotencyKey, required: false, into: &errors)
        try errors.throwIfAny()
        let retry = Self.retryKey("InviteHousemate", caller: caller, key: request.idempotencyKey, request: request)
        if let earlier = try await storedAnswer(retry, as: Social_V1_InviteHousemateResponse.self) { return earlier }
        // Membership first (no lookups for strangers), then whose login email it is.
        try await core.store.read { c in try Households.requireMember(c, householdID: householdID, user: caller.userID) }
        let me = try await me(caller)
        let invitee = (await core.directory.users(emails: [email]))?[email]
        let now = core.now()
        let limits = core.configuration
        return try await core.writePublishing { tx, out -> Social_V1_InviteHousemateResponse in
            try tx.once(retry, now: now) {
                try Households.requireMember(tx, householdID: householdID, user: me.userId)
                if let invitee, try Households.isMember(tx, householdID: householdID, user: invitee.userId) {
                    throw FieldErrors.single(.alreadyExists, field: "email", "\(invitee.username) is already a member of this household")
                }
                let pending = try tx.queryOne(
                    "SELECT count(*) FROM household_invites WHERE household_id = ? AND used_at IS NULL AND revoked_at IS NULL AND expires_at > ?",
                    householdID, now)!.get(0, as: Int64.self)
                if pending >= limits.maxPendingInvitesPerHousehold {
                    throw RPCError(.failedPrecondition, "this household has \(pending) pending invites: wait until some are used or expire")
                }
                try Households.checkMailQuota(tx, inviter: me.userId, emails: [email], field: "email", now: now, limits: limits)
                let name: String = try tx.queryOne("SELECT name FROM households WHERE id = ?", householdID)!.get(0)
                var response = Social_V1_InviteHousemateResponse()
                response.invite = try Households.invite(
                    tx, householdID: householdID, householdName: name, email: email, by: me, invitee: invitee,
                    now: now, lifetime: limits.inviteLifetime, out: &out)
                return response
            }
        }
    }

    public func removeHousemate(request: Social_V1_RemoveHousemateRequest, context: ServerContext) async throws -> Social_V1_RemoveHousemateResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let householdID = FieldRules.id(request.householdId, field: "household_id", into: &errors)
        let userID = FieldRules.id(request.userId, field: "user_id", into: &errors)
        try errors.throwIfAny()
        let me = try await me(caller)
        let now = core.now()
        let deleted = try await core.writePublishing { tx, out -> Bool in
            try Households.requireMember(tx, householdID: householdID, user: me.userId)
            guard try Households.isMember(tx, householdID: householdID, user: userID) else {
                throw FieldErrors.single(.notFound, field: "user_id", "not a member of this household")
            }
            let deleted = try Households.removeMember(tx, householdID: householdID, user: userID, now: now)
            if userID != me.userId {
                let name: String = try tx.queryOne("SELECT name FROM households WHERE id = ?", householdID)!.get(0)
                var target = Social_V1_NotificationTarget()
                target.householdId = householdID
                _ = try Inbox.store(
                    tx, recipient: userID,
                    .init(
                        kind: .householdRemoved, title: "\(Self.name(me)) removed you from \(name)", actor: me,
                        target: target, data: ["household_name": name]), now: now, out: &out)
            }
            return deleted
        }
        var response = Social_V1_RemoveHousemateResponse()
        response.householdDeleted = deleted
        return response
    }

    public func listHousemates(request: Social_V1_ListHousematesRequest, context: ServerContext) async throws -> Social_V1_ListHousematesResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let householdID = FieldRules.id(request.householdId, field: "household_id", into: &errors)
        let size = FieldRules.pageSize(request.pageSize, into: &errors)
        let filters = "housemates:\(householdID)"
        let after = core.pageTokens.cursor(request.pageToken, filters: filters, parts: 1, into: &errors).flatMap { Int64($0[0]) }
        try errors.throwIfAny()
        let rows = try await core.store.read { c -> [(Int64, Social_V1_Housemate)] in
            try Households.requireMember(c, householdID: householdID, user: caller.userID)
            return try Households.housemates(c, householdID: householdID, afterSeq: after ?? 0, limit: size + 1)
        }
        core.directory.refreshSoon(ids: rows.map(\.1.user.userId))
        var response = Social_V1_ListHousematesResponse()
        response.housemates = rows.prefix(size).map(\.1)
        if rows.count > size { response.nextPageToken = core.pageTokens.make(cursor: [String(rows[size - 1].0)], filters: filters) }
        return response
    }

    public func getHousehold(request: Social_V1_GetHouseholdRequest, context: ServerContext) async throws -> Social_V1_GetHouseholdResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let householdID = FieldRules.id(request.householdId, field: "household_id", into: &errors)
        try errors.throwIfAny()
        let now = core.now()
        return try await core.store.read { c in
            try Households.requireMember(c, householdID: householdID, user: caller.userID)
            var response = Social_V1_GetHouseholdResponse()
            response.household = try Households.household(c, id: householdID)!
            response.pendingInvites = try c.query(
                """
                SELECT * FROM household_invites WHERE household_id = ? AND used_at IS NULL AND revoked_at IS NULL AND expires_at > ?
                ORDER BY created_at DESC, code
                """, householdID, now
            ).map(Households.invite)
            return response
        }
    }

    public func listMyHouseholds(
        request: Social_V1_ListMyHouseholdsRequest, context: ServerContext
    ) async throws -> Social_V1_ListMyHouseholdsResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let size = FieldRules.pageSize(request.pageSize, into: &errors)
        let cursor = core.pageTokens.cursor(request.pageToken, filters: "my-households", parts: 2, into: &errors)
        try errors.throwIfAny()
        let after = (Int64(cursor?[0] ?? "") ?? Int64.min, cursor?[1] ?? "")
        let (households, last) = try await core.store.read { c -> ([Social_V1_Household], (Int64, String)?) in
            let rows = try c.query(
                """
                SELECT m.household_id, m.joined_at FROM household_members m JOIN households h ON h.id = m.household_id
                WHERE m.user_id = ?1 AND m.left_at IS NULL AND h.deleted_at IS NULL
                  AND (m.joined_at > ?2 OR (m.joined_at = ?2 AND m.household_id > ?3))
                ORDER BY m.joined_at, m.household_id LIMIT ?4
                """, caller.userID, after.0, after.1, size + 1)
            let list = try rows.prefix(size).map { try Households.household(c, id: $0.get("household_id"))! }
            let last =
                rows.count > size
                ? (try rows[size - 1].get("joined_at", as: Int64.self), try rows[size - 1].get("household_id", as: String.self)) : nil
            return (list, last)
        }
        var response = Social_V1_ListMyHouseholdsResponse()
        response.households = households
        if let last { response.nextPageToken = core.pageTokens.make(cursor: [String(last.0), last.1], filters: "my-households") }
        return response
    }

    public func getHousemateProfile(
        request: Social_V1_GetHousemateProfileRequest, context: ServerContext
    ) async throws -> Social_V1_GetHousemateProfileResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let householdID = FieldRules.id(request.householdId, field: "household_id", into: &errors)
        let userID = FieldRules.id(request.userId, field: "user_id", into: &errors)
        try errors.throwIfAny()
        let housemate = try await core.store.read { c -> Social_V1_Housemate in
            try Households.requireMember(c, householdID: householdID, user: caller.userID)
            guard let h = try Households.housemate(c, householdID: householdID, user: userID) else {
                throw FieldErrors.single(.notFound, field: "user_id", "not a member of this household")
            }
            return h
        }
        var response = Social_V1_GetHousemateProfileResponse()
        core.directory.refreshSoon(ids: [userID])
        response.housemate = housemate
        // tasks, with a short deadline: the profile answers without the chores while tasks cannot.
        let tasks = Tasks_V1_TasksInternalClient(core.peers.client("tasks"))
        var chores: [Tasks_V1_Chore] = []
        var token = ""
        // One deadline for all pages together, so a slow tasks delays the profile by at most that.
        let deadline = ContinuousClock.now + core.configuration.peerDeadline
        do {
            for _ in 0..<10 {
                let left = deadline - ContinuousClock.now
                guard left > .milliseconds(1) else { throw RPCError(.deadlineExceeded, "tasks did not answer in time") }
                var r = Tasks_V1_ListTasksAssignedToUserRequest()
                r.userId = userID
                r.householdId = householdID
                r.pageSize = 100
                r.pageToken = token
                let page = try await tasks.listTasksAssignedToUser(r, options: CallOptions(timeout: left))
                chores += page.chores
                token = page.nextPageToken
                if token.isEmpty { break }
            }
            response.assignedChores = Households.assigned(chores, today: Households.utcDate(core.now()))
        } catch {
            core.logger.warning("tasks did not answer ListTasksAssignedToUser", metadata: ["error": "\(error)"])
            response.assignedChoresUnavailable = true
        }
        return response
    }
}

/// Household queries and effects shared by the handlers and EraseUser.
enum Households {
    static func isMember(_ db: some SQLReader, householdID: String, user: String) throws -> Bool {
        try db.queryOne("SELECT 1 FROM household_members WHERE household_id = ? AND user_id = ? AND left_at IS NULL", householdID, user) != nil
    }

    /// NOT_FOUND unless `user` is a current member of a live household (strangers cannot tell a
    /// household they are not in from one that does not exist).
    static func requireMember(_ db: some SQLReader, householdID: String, user: String) throws {
        guard
            try db.queryOne(
                """
                SELECT 1 FROM household_members m JOIN households h ON h.id = m.household_id
                WHERE m.household_id = ? AND m.user_id = ? AND m.left_at IS NULL AND h.deleted_at IS NULL
                """, householdID, user) != nil
        else { throw FieldErrors.single(.notFound, field: "household_id", "no such household among yours") }
    }

    static func checkRoomForAnother(_ db: some SQLReader, user: String, limit: Int) throws {
        let n = try db.queryOne(
            "SELECT count(*) FROM household_members m JOIN households h ON h.id = m.household_id WHERE m.user_id = ? AND m.left_at IS NULL AND h.deleted_at IS NULL",
            user)!.get(0, as: Int64.self)
        if n >= limit { throw RPCError(.failedPrecondition, "you belong to \(n) households, the most one user may: leave one first") }
    }

    static func memberIDs(_ db: some SQLReader, householdID: String) throws -> [String] {
        try db.query("SELECT user_id FROM household_members WHERE household_id = ? AND left_at IS NULL ORDER BY join_seq", householdID)
            .map { try $0.get(0) }
    }

    static func addMember(_ tx: Transaction, householdID: String, user: String, now: Int64) throws {
        let seq: Int64 = try tx.queryOne("SELECT next_join_seq FROM households WHERE id = ?", householdID)!.get(0)
        try tx.execute("UPDATE households SET next_join_seq = next_join_seq + 1 WHERE id = ?", householdID)
        try tx.execute(
            """
            INSERT INTO household_members (household_id, user_id, join_seq, joined_at) VALUES (?, ?, ?, ?)
            ON CONFLICT(household_id, user_id) DO UPDATE SET join_seq = excluded.join_seq, joined_at = excluded.joined_at, left_at = NULL
            """, householdID, user, seq, now)
    }

    /// Marks `user` as a former member; the last member leaving deletes the household. Otherwise,
    /// with `handOnChores`, tasks hands the member's chores in this household to the others
    /// (`RemoveHousemateChores`, through the outbox in this transaction, so it happens even if
    /// tasks is down now). An erasure passes false: tasks' own EraseUser takes the user out of
    /// every household's chores, and two events from two outboxes would race.
    static func removeMember(_ tx: Transaction, householdID: String, user: String, now: Int64, handOnChores: Bool = true) throws -> Bool {
        try tx.execute(
            "UPDATE household_members SET left_at = ? WHERE household_id = ? AND user_id = ? AND left_at IS NULL",
            now, householdID, user)
        guard tx.changes == 1 else { return false }
        let remaining = try memberIDs(tx, householdID: householdID)
        if remaining.isEmpty {
            try delete(tx, householdID: householdID, now: now)
            return true
        }
        guard handOnChores else { return false }
        var left = Tasks_V1_RemoveHousemateChoresRequest()
        left.eventId = "social:left:\(ULID.make(now: now))"  // one per removal: a user may rejoin and leave again
        left.householdId = householdID
        left.userId = user
        left.remainingMemberIds = remaining
        try tx.enqueueCall(Tasks_V1_TasksInternalMethods.removeHousemateChores, left, eventID: left.eventId)
        return false
    }

    /// Deletes a household: memberships freeze as they are (finance reads them), pending invites
    /// stop working, and tasks ends its chores (through the outbox, so it happens even if tasks is
    /// down now).
    static func delete(_ tx: Transaction, householdID: String, now: Int64) throws {
        try tx.execute("UPDATE households SET deleted_at = ? WHERE id = ? AND deleted_at IS NULL", now, householdID)
        guard tx.changes == 1 else { return }
        try tx.execute(
            "UPDATE household_invites SET revoked_at = ? WHERE household_id = ? AND used_at IS NULL AND revoked_at IS NULL",
            now, householdID)
        var end = Tasks_V1_EndHouseholdChoresRequest()
        end.eventId = "social:end-chores:\(householdID)"
        end.householdId = householdID
        try tx.enqueueCall(Tasks_V1_TasksInternalMethods.endHouseholdChores, end, eventID: end.eventId)
    }

    /// Refuses (RESOURCE_EXHAUSTED with RetryInfo) a batch of invite mails to `emails` from `inviter`
    /// past the sender's quota, or one to an `email` past the address's quota, both counted over
    /// the invites made in the last `window` (revoked ones included: each was a mail). Checked in
    /// the write transaction, so concurrent invites cannot overshoot.
    static func checkMailQuota(
        _ tx: Transaction, inviter: String, emails: [String], field: String, now: Int64, limits: SocialConfiguration
    ) throws {
        guard !emails.isEmpty else { return }
        let since = now - limits.inviteMailWindow.milliseconds
        let window = "\(limits.inviteMailWindow.milliseconds / 3_600_000) hours"
        let sent = try tx.queryOne(
            "SELECT count(*), min(created_at) FROM household_invites WHERE invited_by = ? AND created_at > ?", inviter, since)!
        let sentCount: Int64 = try sent.get(0)
        if sentCount + Int64(emails.count) > Int64(limits.maxInviteMailsPerUser) {
            let oldest: Int64 = (try? sent.get(1)) ?? now
            throw RPCError.retryLater(
                "\(field): you sent \(sentCount) invites in the last \(window) (at most \(limits.maxInviteMailsPerUser))",
                after: .milliseconds(max(1000, oldest + limits.inviteMailWindow.milliseconds - now)))
        }
        for email in emails {
            let row = try tx.queryOne(
                "SELECT count(*), min(created_at) FROM household_invites WHERE email_key = ? AND created_at > ?", FieldRules.key(email), since)!
            let count: Int64 = try row.get(0)
            if count >= Int64(limits.maxInviteMailsPerAddress) {
                let oldest: Int64 = (try? row.get(1)) ?? now
                throw RPCError.retryLater(
                    "\(field): \(email) was sent \(count) invites in the last \(window) (at most \(limits.maxInviteMailsPerAddress))",
                    after: .milliseconds(max(1000, oldest + limits.inviteMailWindow.milliseconds - now)))
            }
        }
    }

    /// A new single-use invite for `email`, mailed through accounts' outbox (SendMail, queued in
    /// this transaction), and an in-app notification when the email is a user's login email. An
    /// earlier pending invite of the same household to the same address is revoked.
    static func invite(
        _ tx: Transaction, householdID: String, householdName: String, email: String, by inviter: Common_V1_UserRef,
        invitee: Common_V1_UserRef?, now: Int64, lifetime: Duration, out: inout Outbound
    ) throws -> Social_V1_HouseholdInvite {
        try tx.execute(
            "UPDATE household_invites SET revoked_at = ? WHERE household_id = ? AND email_key = ? AND used_at IS NULL AND revoked_at IS NULL",
            now, householdID, FieldRules.key(email))
        var code = InviteCode.make()
        while try tx.queryOne("SELECT 1 FROM household_invites WHERE code = ?", code) != nil { code = InviteCode.make() }
        let expires = now + lifetime.milliseconds
        try tx.execute(
            "INSERT INTO household_invites (code, household_id, email, email_key, invited_by, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            code, householdID, email, FieldRules.key(email), inviter.userId, now, expires)
        let shown = InviteCode.display(code)
        let who = SocialService.name(inviter)
        var mail = Accounts_V1_SendMailRequest()
        mail.eventId = "social:invite:\(ULID.make(now: now))"
        mail.kind = .householdInvite
        mail.toEmail = email
        mail.subject = String("\(who) invited you to \(householdName) on ChoreMate".unicodeScalars.prefix(200))
        mail.bodyText = """
            Hi!

            \(who) invited you to join the household "\(householdName)" on ChoreMate.
            Enter this invite code in the app: \(shown)

            The code works once and expires in \(lifetime.milliseconds / 86_400_000 > 0 ? "\(lifetime.milliseconds / 86_400_000) days" : "\(lifetime.milliseconds / 3_600_000) hours").
            """
        mail.data = ["invite_code": shown, "household_id": householdID]
        try tx.enqueueCall(Accounts_V1_AccountsInternalMethods.sendMail, mail, eventID: mail.eventId)
        if let invitee, invitee.userId != inviter.userId {
            var target = Social_V1_NotificationTarget()
            target.householdId = householdID
            _ = try Inbox.store(
                tx, recipient: invitee.userId,
                .init(
                    kind: .householdInvite, title: "\(who) invited you to \(householdName)", actor: inviter,
                    target: target, data: ["household_name": householdName, "invite_code": shown]),
                now: now, out: &out)
        }
        var i = Social_V1_HouseholdInvite()
        i.inviteCode = shown
        i.householdId = householdID
        i.email = email
        i.invitedByUserId = inviter.userId
        i.createdAt = Google_Protobuf_Timestamp(milliseconds: now)
        i.expiresAt = Google_Protobuf_Timestamp(milliseconds: expires)
        return i
    }

    static func invite(_ row: Row) throws -> Social_V1_HouseholdInvite {
        var i = Social_V1_HouseholdInvite()
        i.inviteCode = InviteCode.display(try row.get("code"))
        i.householdId = try row.get("household_id")
        i.email = try row.get("email")
        i.invitedByUserId = try row.get("invited_by")
        i.createdAt = Google_Protobuf_Timestamp(milliseconds: try row.get("created_at"))
        i.expiresAt = Google_Protobuf_Timestamp(milliseconds: try row.get("expires_at"))
        return i
    }

    static let housemateSelect = """
        SELECT m.join_seq, m.joined_at, m.user_id AS member, u.id, u.username, u.display_name FROM household_members m
        LEFT JOIN users u ON u.id = m.user_id
        """

    static func housemate(_ row: Row, userID: String) throws -> Social_V1_Housemate {
        var h = Social_V1_Housemate()
        if try row.get("id", as: String?.self) != nil { h.user = try UserDirectory.ref(row) } else { h.user.userId = userID }
        h.joinedAt = Google_Protobuf_Timestamp(milliseconds: try row.get("joined_at"))
        return h
    }

    static func housemates(_ db: some SQLReader, householdID: String, afterSeq: Int64, limit: Int) throws -> [(Int64, Social_V1_Housemate)] {
        try db.query(
            "\(housemateSelect) WHERE m.household_id = ? AND m.left_at IS NULL AND m.join_seq > ? ORDER BY m.join_seq LIMIT ?",
            householdID, afterSeq, limit
        ).map { (try $0.get("join_seq"), try housemate($0, userID: try $0.get("member"))) }
    }

    static func housemate(_ db: some SQLReader, householdID: String, user: String) throws -> Social_V1_Housemate? {
        try db.queryOne("\(housemateSelect) WHERE m.household_id = ? AND m.user_id = ? AND m.left_at IS NULL", householdID, user)
            .map { try housemate($0, userID: user) }
    }

    static func household(_ db: some SQLReader, id: String) throws -> Social_V1_Household? {
        guard let row = try db.queryOne("SELECT id, name, created_by, created_at FROM households WHERE id = ?", id) else { return nil }
        var h = Social_V1_Household()
        h.householdId = id
        h.name = try row.get("name")
        h.createdByUserId = try row.get("created_by")
        h.createdAt = Google_Protobuf_Timestamp(milliseconds: try row.get("created_at"))
        h.members = try housemates(db, householdID: id, afterSeq: 0, limit: 1000).map(\.1)
        return h
    }

    // MARK: Chores from tasks

    static func utcDate(_ ms: Int64) -> Common_V1_Date {
        // Days since the epoch → civil date (Howard Hinnant's algorithm).
        let z = (ms >= 0 ? ms / 86_400_000 : (ms - 86_399_999) / 86_400_000) + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let doe = z - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let d = doy - (153 * mp + 2) / 5 + 1
        let m = mp < 10 ? mp + 3 : mp - 9
        var date = Common_V1_Date()
        date.year = Int32(yoe + era * 400 + (m <= 2 ? 1 : 0))
        date.month = Int32(m)
        date.day = Int32(d)
        return date
    }

    static func isSet(_ d: Common_V1_Date) -> Bool { d.year != 0 || d.month != 0 || d.day != 0 }
    static func order(_ d: Common_V1_Date) -> Int64 { Int64(d.year) * 10_000 + Int64(d.month) * 100 + Int64(d.day) }

    /// The chores as the profile shows them: soonest due first, on-demand (no due date) last;
    /// overdue when the due date is before today (UTC).
    static func assigned(_ chores: [Tasks_V1_Chore], today: Common_V1_Date) -> [Social_V1_AssignedChore] {
        chores.map { c in
            var a = Social_V1_AssignedChore()
            a.taskId = c.choreId
            a.name = c.name
            if c.hasDueDate, isSet(c.dueDate) {
                a.dueDate = c.dueDate
                a.overdue = order(c.dueDate) < order(today)
            }
            return a
        }.sorted { x, y in
            let dx = x.hasDueDate ? order(x.dueDate) : Int64.max, dy = y.hasDueDate ? order(y.dueDate) : Int64.max
            return dx != dy ? dx < dy : x.taskId < y.taskId
        }
    }
}
