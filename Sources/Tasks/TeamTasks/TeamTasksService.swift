import Contracts
import Foundation
import RPCCore
import Security
import ServiceKit
import Storage

/// Team tasks (seed A), `tasks.v1.Tasks` team-task RPCs: create with usernames, my lists, detail,
/// comments, opt out, completion, help, the public link, upload tokens and attachments.
extension TasksService {
    public func createTeamTask(request: Tasks_V1_CreateTeamTaskRequest, context: ServerContext) async throws -> Tasks_V1_CreateTeamTaskResponse {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let key = FieldRules.idempotencyKey(request.idempotencyKey, into: &errors)
        let name = FieldRules.text(request.name, field: "name", TeamTaskRules.nameLength, into: &errors)
        let description = FieldRules.text(
            request.description_p, field: "description", TeamTaskRules.descriptionLength, multiline: true, into: &errors)
        if request.participantUsernames.count > TeamTaskRules.maxOtherParticipants {
            errors.add("participant_usernames", "at most \(TeamTaskRules.maxOtherParticipants) other participants")
        }
        var asked: [(index: Int, name: String)] = []
        for (i, raw) in request.participantUsernames.prefix(TeamTaskRules.maxOtherParticipants).enumerated() {
            let n = FieldRules.trimmed(raw)
            if n.isEmpty {
                errors.add("participant_usernames[\(i)]", "required (a username)")
            } else if FieldRules.length(n) > TeamTaskRules.maxUsernameLength || FieldRules.hasControlCharacters(n) {
                errors.add("participant_usernames[\(i)]", "is not a username")
            } else {
                asked.append((i, n))
            }
        }
        try errors.throwIfAny()

        let scope = "CreateTeamTask:\(me)", fingerprint = Idempotency.fingerprint(request)
        if var replay = try await core.store.storedAnswer(scope: scope, key: key, fingerprint: fingerprint, as: Tasks_V1_CreateTeamTaskResponse.self)
        {
            replay.replayed = true
            return replay
        }

        // Usernames → users (every unknown one named), the creator's name, the creator's team.
        var distinct: [String] = []
        var seen = Set<String>()
        for a in asked where seen.insert(FieldRules.key(a.name)).inserted { distinct.append(a.name) }
        async let resolvedCall = core.peers.resolveUsernames(distinct)
        async let teamCall = core.peers.teamOf(me)
        async let meCall = core.users.lookUp([me])
        let (found, unknown) = try await resolvedCall
        var unknownErrors = FieldErrors()
        for a in asked
        where found[a.name] == nil && (unknown.contains(a.name) || found.first(where: { FieldRules.key($0.key) == FieldRules.key(a.name) }) == nil) {
            unknownErrors.add("participant_usernames[\(a.index)]", "no user named \"\(a.name)\"")
        }
        try unknownErrors.throwIfAny(summary: "unknown usernames")
        let teamID = try await teamCall
        let meRef = try await meCall
        guard let creator = meRef[me] else { throw RPCError(.unauthenticated, "the account of this access token no longer exists") }
        var everyone: [Common_V1_UserRef] = [creator]
        var ids = Set([me])
        for name in distinct {
            guard let ref = found[name] ?? found.first(where: { FieldRules.key($0.key) == FieldRules.key(name) })?.value else { continue }
            if ids.insert(ref.userId).inserted { everyone.append(ref) }
        }
        let participants = everyone

        let now = core.now
        let core = self.core
        let (response, replayed) = try await core.write { tx -> (Tasks_V1_CreateTeamTaskResponse, Bool) in
            try tx.idempotent(scope: scope, key: key, fingerprint: fingerprint, now: now) {
                let id = ULID.make(now: now)
                try tx.execute(
                    "INSERT INTO team_tasks (id, name, description, creator_id, team_id, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                    id, name, description, me, teamID, now)
                for (i, p) in participants.enumerated() {
                    try tx.execute(
                        "INSERT INTO team_task_participants (task_id, user_id, position) VALUES (?, ?, ?)", id, p.userId, Int64(i))
                }
                try UserDirectory.remember(tx, participants, now: now)
                try TeamTaskStore.journal(
                    tx, "team-task.created", task: id, at: now,
                    fields: [("team_id", .text(teamID)), ("participant_count", .int(Int64(participants.count)))],
                    personal: [
                        Journal.Personal("creator", owner: me, me), Journal.Personal("name", owner: me, name),
                        Journal.Personal("description", owner: me, description),
                    ] + participants.dropFirst().map { Journal.Personal("participant", owner: $0.userId, $0.userId) })
                try core.notify(
                    tx, kind: .taskAssigned, recipients: participants.dropFirst().map(\.userId), actor: me,
                    title: "New team task: \(name)", body: "\(Self.displayName(creator)) added you to \"\(name)\".", target: .taskId(id),
                    data: ["task_id": id, "area": "team-task"], eventID: "tasks:team-task-assigned:\(id)")
                let row = try TeamTaskStore.participating(tx, task: id, user: me)
                var r = Tasks_V1_CreateTeamTaskResponse()
                r.task = TeamTaskStore.proto(row, viewer: me, users: Dictionary(uniqueKeysWithValues: participants.map { ($0.userId, $0) }))
                return r
            }
        }
        var out = response
        out.replayed = replayed
        return out
    }

    static func displayName(_ u: Common_V1_UserRef) -> String { u.displayName.isEmpty ? u.username : u.displayName }

    public func listMyTeamTasks(request: Tasks_V1_ListMyTeamTasksRequest, context: ServerContext) async throws -> Tasks_V1_ListMyTeamTasksResponse {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let pageSize = FieldRules.pageSize(request.pageSize, defaultSize: 20, into: &errors)
        let view: Int
        switch request.view {
        case .unspecified: view = 0
        case .toDo: view = 1
        case .completed: view = 2
        case .unrecognized: view = -1
        }
        if view < 0 { errors.add("view", "unknown view") }
        let filters = "my-team-tasks:\(me):\(view)"
        var opened: String?
        if !request.pageToken.isEmpty {
            opened = core.pageTokens.open(request.pageToken, filters: filters, parts: 1)?.first
            if opened == nil { errors.add("page_token", "not a page token of this list (forged, or made for another view)") }
        }
        try errors.throwIfAny()
        let cursor = opened
        let staleBefore = core.users.staleBefore
        let (rows, users, more) = try await core.read { c in
            var sql = "SELECT task_id FROM team_task_participants WHERE user_id = ?"
            var args: [DatabaseValue] = [.text(me)]
            if view == 1 { sql += " AND completed_at IS NULL" }
            if view == 2 { sql += " AND completed_at IS NOT NULL" }
            if let cursor {
                sql += " AND task_id < ?"
                args.append(.text(cursor))
            }
            sql += " ORDER BY task_id DESC LIMIT ?"
            args.append(.integer(Int64(pageSize + 1)))
            let ids = try c.query(sql, arguments: args).map { try $0.get(0, as: String.self) }
            let rows = try TeamTaskStore.load(c, ids: Array(ids.prefix(pageSize)))
            let users = try UserDirectory.cached(c, TeamTaskStore.userIDs(rows), staleBefore: staleBefore)
            return (rows, users, ids.count > pageSize)
        }
        core.users.refreshIfStale(users.stale)
        var response = Tasks_V1_ListMyTeamTasksResponse()
        response.tasks = rows.map { TeamTaskStore.proto($0, viewer: me, users: users.refs) }
        if more, let last = rows.last { response.nextPageToken = core.pageTokens.make(cursor: [last.id], filters: filters) }
        return response
    }

    public func getTeamTask(request: Tasks_V1_GetTeamTaskRequest, context: ServerContext) async throws -> Tasks_V1_GetTeamTaskResponse {
        let me = try core.caller(context)
        let id = try Self.taskID(request.taskId)
        let staleBefore = core.users.staleBefore
        let (row, users) = try await core.read { c in
            let row = try TeamTaskStore.participating(c, task: id, user: me)
            return (row, try UserDirectory.cached(c, TeamTaskStore.userIDs([row]), staleBefore: staleBefore))
        }
        core.users.refreshIfStale(users.stale)
        var response = Tasks_V1_GetTeamTaskResponse()
        response.task = TeamTaskStore.proto(row, viewer: me, users: users.refs)
        return response
    }

    /// A task id from a request: required, at most 64 characters.
    static func taskID(_ raw: String, field: String = "task_id") throws -> String {
        var errors = FieldErrors()
        let id = FieldRules.id(raw, field: field, into: &errors)
        try errors.throwIfAny()
        return id
    }

    public func listTeamTaskComments(
        request: Tasks_V1_ListTeamTaskCommentsRequest, context: ServerContext
    ) async throws -> Tasks_V1_ListTeamTaskCommentsResponse {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let id = FieldRules.id(request.taskId, field: "task_id", into: &errors)
        let pageSize = FieldRules.pageSize(request.pageSize, defaultSize: 50, into: &errors)
        let filters = "team-task-comments:\(id)"
        var opened: String?
        if !request.pageToken.isEmpty {
            opened = core.pageTokens.open(request.pageToken, filters: filters, parts: 1)?.first
            if opened == nil { errors.add("page_token", "not a page token of this task's comments") }
        }
        try errors.throwIfAny()
        let cursor = opened
        let staleBefore = core.users.staleBefore
        let (rows, users) = try await core.read { c in
            _ = try TeamTaskStore.participating(c, task: id, user: me)
            let rows = try c.query(
                "SELECT id, author_id, text, created_at FROM team_task_comments WHERE task_id = ? AND id > ? ORDER BY id LIMIT ?", id, cursor ?? "",
                Int64(pageSize + 1))
            let authors = try rows.compactMap { try $0.get("author_id", as: String?.self) }
            return (rows, try UserDirectory.cached(c, authors, staleBefore: staleBefore))
        }
        core.users.refreshIfStale(users.stale)
        var response = Tasks_V1_ListTeamTaskCommentsResponse()
        response.comments = try rows.prefix(pageSize).map { r in
            var m = Tasks_V1_TeamTaskComment()
            m.commentId = try r.get("id")
            m.taskId = id
            m.author = users.refs.ref(try r.get("author_id", as: String?.self))
            m.text = try r.get("text")
            m.createdAt = Google_Protobuf_Timestamp(milliseconds: try r.get("created_at"))
            return m
        }
        if rows.count > pageSize, let last = response.comments.last {
            response.nextPageToken = core.pageTokens.make(cursor: [last.commentId], filters: filters)
        }
        return response
    }

    public func addTeamTaskComment(
        request: Tasks_V1_AddTeamTaskCommentRequest, context: ServerContext
    ) async throws -> Tasks_V1_AddTeamTaskCommentResponse {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let key = FieldRules.idempotencyKey(request.idempotencyKey, into: &errors)
        let id = FieldRules.id(request.taskId, field: "task_id", into: &errors)
        let text = FieldRules.text(request.text, field: "text", TeamTaskRules.commentLength, multiline: true, into: &errors)
        try errors.throwIfAny()
        let scope = "AddTeamTaskComment:\(me)", fingerprint = Idempotency.fingerprint(request)
        let now = core.now
        let core = self.core
        let (response, replayed) = try await core.write { tx -> (Tasks_V1_AddTeamTaskCommentResponse, Bool) in
            try tx.idempotent(scope: scope, key: key, fingerprint: fingerprint, now: now) {
                let task = try TeamTaskStore.participating(tx, task: id, user: me)
                let commentID = ULID.make(now: now)
                try tx.execute(
                    "INSERT INTO team_task_comments (id, task_id, author_id, text, created_at) VALUES (?, ?, ?, ?, ?)", commentID, id, me, text, now)
                try tx.execute("UPDATE team_tasks SET comment_count = comment_count + 1 WHERE id = ?", id)
                try TeamTaskStore.journal(
                    tx, "team-task.comment-added", task: id, at: now, fields: [("comment_id", .text(commentID))],
                    personal: [Journal.Personal("author", owner: me, me), Journal.Personal("text", owner: me, text)])
                let users = try UserDirectory.cached(tx, [me])
                try core.notify(
                    tx, kind: .taskComment, recipients: task.participants.map(\.userID).filter { $0 != me }, actor: me,
                    title: "New comment on \(task.name)", body: "\(Self.displayName(users.ref(me))): \(text)", target: .taskId(id),
                    data: ["task_id": id, "comment_id": commentID, "area": "team-task"], eventID: "tasks:team-task-comment:\(commentID)")
                var m = Tasks_V1_TeamTaskComment()
                m.commentId = commentID
                m.taskId = id
                m.author = users.ref(me)
                m.text = text
                m.createdAt = Google_Protobuf_Timestamp(milliseconds: now)
                var r = Tasks_V1_AddTeamTaskCommentResponse()
                r.comment = m
                return r
            }
        }
        var out = response
        out.replayed = replayed
        return out
    }

    public func optOutOfTeamTask(request: Tasks_V1_OptOutOfTeamTaskRequest, context: ServerContext) async throws -> Tasks_V1_OptOutOfTeamTaskResponse
    {
        let me = try core.caller(context)
        let id = try Self.taskID(request.taskId)
        let now = core.now
        try await core.write { tx in
            let task = try TeamTaskStore.participating(tx, task: id, user: me)
            if task.creatorID == me {
                throw RPCError(.failedPrecondition, "you created this task, so you cannot opt out of it")
            }
            try tx.execute("DELETE FROM team_task_participants WHERE task_id = ? AND user_id = ?", id, me)
            try TeamTaskStore.journal(
                tx, "team-task.opted-out", task: id, at: now, fields: [], personal: [Journal.Personal("participant", owner: me, me)])
            if task.participants.count == 1 {
                try TeamTaskStore.deleteTask(tx, task: id, now: now)
            } else {
                try TeamTaskStore.settleCompletion(tx, task: id, now: now, actor: nil)
            }
        }
        return Tasks_V1_OptOutOfTeamTaskResponse()
    }

    public func setTeamTaskCompletion(
        request: Tasks_V1_SetTeamTaskCompletionRequest, context: ServerContext
    ) async throws -> Tasks_V1_SetTeamTaskCompletionResponse {
        let me = try core.caller(context)
        let id = try Self.taskID(request.taskId)
        let completed = request.completed
        let now = core.now
        let (row, users) = try await core.write { tx in
            let task = try TeamTaskStore.participating(tx, task: id, user: me)
            let current = task.participant(me)?.completedAt != nil
            if current != completed {
                try tx.execute(
                    "UPDATE team_task_participants SET completed_at = ? WHERE task_id = ? AND user_id = ?", completed ? now : nil, id, me)
                try TeamTaskStore.journal(
                    tx, completed ? "team-task.completion-marked" : "team-task.completion-withdrawn", task: id, at: now, fields: [],
                    personal: [Journal.Personal("participant", owner: me, me)])
                try TeamTaskStore.settleCompletion(tx, task: id, now: now, actor: me)
            }
            let row = try TeamTaskStore.participating(tx, task: id, user: me)
            return (row, try UserDirectory.cached(tx, TeamTaskStore.userIDs([row])))
        }
        var response = Tasks_V1_SetTeamTaskCompletionResponse()
        response.task = TeamTaskStore.proto(row, viewer: me, users: users)
        return response
    }

    // MARK: Help

    public func requestTeamTaskHelp(
        request: Tasks_V1_RequestTeamTaskHelpRequest, context: ServerContext
    ) async throws -> Tasks_V1_RequestTeamTaskHelpResponse {
        var response = Tasks_V1_RequestTeamTaskHelpResponse()
        response.notifiedCount = try await help(taskID: request.taskId, message: request.message, offer: false, context: context)
        return response
    }

    public func offerTeamTaskHelp(
        request: Tasks_V1_OfferTeamTaskHelpRequest, context: ServerContext
    ) async throws -> Tasks_V1_OfferTeamTaskHelpResponse {
        var response = Tasks_V1_OfferTeamTaskHelpResponse()
        response.notifiedCount = try await help(taskID: request.taskId, message: request.message, offer: true, context: context)
        return response
    }

    /// A help request or offer: every other participant is notified through social (the outbox),
    /// or FAILED_PRECONDITION when there is no one else.
    func help(taskID raw: String, message rawMessage: String, offer: Bool, context: ServerContext) async throws -> Int32 {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let id = FieldRules.id(raw, field: "task_id", into: &errors)
        let message = FieldRules.text(rawMessage, field: "message", TeamTaskRules.helpMessageLength, multiline: true, into: &errors)
        try errors.throwIfAny()
        let now = core.now
        let core = self.core
        return try await core.write { tx in
            let task = try TeamTaskStore.participating(tx, task: id, user: me)
            let others = task.participants.map(\.userID).filter { $0 != me }
            guard !others.isEmpty else {
                throw RPCError(
                    .failedPrecondition, "no other participants to \(offer ? "offer help to" : "ask for help"): add participants to the task first")
            }
            let who = Self.displayName(try UserDirectory.cached(tx, [me]).ref(me))
            let eventID = "tasks:team-task-help:\(ULID.make(now: now))"
            try core.notify(
                tx, kind: offer ? .helpOffer : .helpRequest, recipients: others, actor: me,
                title: offer ? "\(who) offers help with \(task.name)" : "\(who) asks for help with \(task.name)",
                body: message.isEmpty ? (offer ? "\(who) can help with \"\(task.name)\"." : "\(who) needs a hand with \"\(task.name)\".") : message,
                target: .taskId(id), data: ["task_id": id, "area": "team-task"], eventID: eventID)
            try TeamTaskStore.journal(
                tx, offer ? "team-task.help-offered" : "team-task.help-requested", task: id, at: now,
                fields: [("notified_count", .int(Int64(others.count)))],
                personal: [Journal.Personal("participant", owner: me, me), Journal.Personal("message", owner: me, message)])
            return Int32(others.count)
        }
    }

    // MARK: Public link

    public func createTeamTaskLink(
        request: Tasks_V1_CreateTeamTaskLinkRequest, context: ServerContext
    ) async throws -> Tasks_V1_CreateTeamTaskLinkResponse {
        let me = try core.caller(context)
        let id = try Self.taskID(request.taskId)
        let now = core.now
        let token = try await core.write { tx -> String in
            let task = try TeamTaskStore.participating(tx, task: id, user: me)
            guard task.participant(me)?.completedAt != nil else {
                throw RPCError(.failedPrecondition, "mark your own completion of the task before sharing a public link to it")
            }
            if let existing = task.linkToken { return existing }
            let token = TeamTaskRules.newLinkToken()
            try tx.execute("UPDATE team_tasks SET link_token = ? WHERE id = ?", token, id)
            try TeamTaskStore.journal(
                tx, "team-task.link-created", task: id, at: now,
                fields: [("link_token_sha256", .text(TeamTaskRules.hex(SHA256.hash(Array(token.utf8)))))],
                personal: [Journal.Personal("participant", owner: me, me)])
            return token
        }
        var response = Tasks_V1_CreateTeamTaskLinkResponse()
        response.linkToken = token
        response.publicPath = "/t/\(token)"
        return response
    }

    public func revokeTeamTaskLink(
        request: Tasks_V1_RevokeTeamTaskLinkRequest, context: ServerContext
    ) async throws -> Tasks_V1_RevokeTeamTaskLinkResponse {
        let me = try core.caller(context)
        let id = try Self.taskID(request.taskId)
        let now = core.now
        let revoked = try await core.write { tx -> Bool in
            let task = try TeamTaskStore.participating(tx, task: id, user: me)
            guard task.linkToken != nil else { return false }
            try tx.execute("UPDATE team_tasks SET link_token = NULL WHERE id = ?", id)
            try TeamTaskStore.journal(
                tx, "team-task.link-revoked", task: id, at: now, fields: [], personal: [Journal.Personal("participant", owner: me, me)])
            return true
        }
        var response = Tasks_V1_RevokeTeamTaskLinkResponse()
        response.revoked = revoked
        return response
    }

    public func getPublicTeamTask(
        request: Tasks_V1_GetPublicTeamTaskRequest, context: ServerContext
    ) async throws -> Tasks_V1_GetPublicTeamTaskResponse {
        let token = request.linkToken
        guard TeamTaskRules.isLinkToken(token) else {
            if token.isEmpty { throw FieldErrors.single(.invalidArgument, field: "link_token", "required") }
            throw RPCError(.notFound, "no task behind this link (it may have been revoked)")
        }
        let (row, users) = try await core.read { c -> (TeamTaskStore.Row, [String: Common_V1_UserRef]) in
            guard let id = try c.queryOne("SELECT id FROM team_tasks WHERE link_token = ?", token).map({ try $0.get(0, as: String.self) }),
                let row = try TeamTaskStore.load(c, ids: [id]).first
            else { throw RPCError(.notFound, "no task behind this link (it may have been revoked)") }
            return (row, try UserDirectory.cached(c, row.participants.map(\.userID)))
        }
        var t = Tasks_V1_PublicTeamTask()
        t.name = row.name
        t.description_p = row.description
        t.participantNames = row.participants.map { Self.displayName(users.ref($0.userID)) }
        t.completedCount = Int32(row.completedCount)
        t.participantCount = Int32(row.participants.count)
        t.status = row.completedAt != nil ? .completed : .open
        if let at = row.completedAt { t.completedAt = Google_Protobuf_Timestamp(milliseconds: at) }
        var response = Tasks_V1_GetPublicTeamTaskResponse()
        response.task = t
        return response
    }

    // MARK: Attachments

    public func createTeamTaskUploadToken(
        request: Tasks_V1_CreateTeamTaskUploadTokenRequest, context: ServerContext
    ) async throws -> Tasks_V1_CreateTeamTaskUploadTokenResponse {
        let me = try core.caller(context)
        let id = try Self.taskID(request.taskId)
        let now = core.now, expires = now + core.configuration.uploadTokenLifetime.milliseconds
        let token = TeamTaskRules.newUploadToken()
        let hash = TeamTaskRules.uploadTokenHash(TeamTaskRules.normalizeUploadToken(token)!)
        let limit = core.configuration.maxLiveUploadTokensPerUser
        try await core.write { tx in
            _ = try TeamTaskStore.participating(tx, task: id, user: me)
            // Each token is a row kept until it expires: a bound per user, counted in the write.
            let live = try tx.queryOne(
                "SELECT count(*), min(expires_at) FROM team_task_upload_tokens WHERE created_by = ? AND expires_at > ?", me, now)!
            if try live.get(0, as: Int64.self) >= Int64(limit) {
                let soonest: Int64 = (try? live.get(1)) ?? now
                throw RPCError.retryLater(
                    "you have \(limit) unexpired upload tokens: use them, or wait until one expires", after: .milliseconds(max(1000, soonest - now)))
            }
            try tx.execute(
                "INSERT INTO team_task_upload_tokens (token_hash, task_id, created_by, created_at, expires_at) VALUES (?, ?, ?, ?, ?)", hash, id, me,
                now, expires)
        }
        var response = Tasks_V1_CreateTeamTaskUploadTokenResponse()
        response.uploadToken = token
        response.expiresAt = Google_Protobuf_Timestamp(milliseconds: expires)
        return response
    }

    public func uploadTeamTaskAttachment(
        request: Tasks_V1_UploadTeamTaskAttachmentRequest, context: ServerContext
    ) async throws -> Tasks_V1_UploadTeamTaskAttachmentResponse {
        let config = core.configuration
        var errors = FieldErrors()
        let normalized = TeamTaskRules.normalizeUploadToken(request.uploadToken)
        if request.uploadToken.isEmpty { errors.add("upload_token", "required") }
        if let problem = TeamTaskRules.filenameProblem(request.filename) { errors.add("filename", problem) }
        if request.data.isEmpty { errors.add("data", "the file is empty") }
        if request.data.count > config.maxAttachmentBytes {
            errors.add("data", "the file is \(request.data.count) bytes; at most \(config.maxAttachmentBytes) (5 MiB) are accepted")
        }
        var contentType = ""
        switch TeamTaskRules.contentType(request.contentType, data: request.data) {
        case .success(let t): contentType = t
        case .failure(let problem): if !request.data.isEmpty { errors.add("content_type", problem.text) }
        }
        try errors.throwIfAny()
        let storedType = contentType
        // A try is reserved against the address *before* the token is looked up (concurrent
        // guesses cannot all pass a check made before any failed), released when the token opens
        // a task or the failure was not the token's, kept when the token was wrong.
        let reservation: SlidingWindowThrottle.Reservation
        switch core.badUploadTokens.reserve(context.clientAddress) {
        case .success(let r): reservation = r
        case .failure(let wait): throw RPCError.throttled("too many wrong upload tokens from this address", wait: wait)
        }
        guard let normalized else {
            reservation.keep()
            throw Self.badToken(expired: false)
        }
        let hash = TeamTaskRules.uploadTokenHash(normalized)
        let now = core.now
        // The digest is computed on this handler's task, before the write (5 MiB of SHA-256 is a
        // few milliseconds), so the single writer only stores.
        let data = request.data
        let digest = TeamTaskRules.hex(SHA256.hash(data))
        let filename = request.filename
        let maxPerTask = config.maxAttachmentsPerTask
        let result: Result<(Tasks_V1_TeamTaskAttachment, String), TokenProblem>
        do {
            result = try await core.write { tx -> Result<(Tasks_V1_TeamTaskAttachment, String), TokenProblem> in
                guard let tok = try tx.queryOne("SELECT task_id, created_by, expires_at FROM team_task_upload_tokens WHERE token_hash = ?", hash)
                else {
                    return .failure(.unknown)
                }
                if try tok.get("expires_at", as: Int64.self) <= now { return .failure(.expired) }
                let taskID: String = try tok.get("task_id"), uploader: String = try tok.get("created_by")
                guard let task = try TeamTaskStore.load(tx, ids: [taskID]).first, task.isParticipant(uploader) else { return .failure(.unknown) }
                if task.attachments.count >= maxPerTask {
                    throw RPCError(.resourceExhausted, "this task already has \(maxPerTask) attachments, the most a task can have")
                }
                try tx.execute("INSERT OR IGNORE INTO attachment_blobs (sha256, size_bytes, data) VALUES (?, ?, ?)", digest, Int64(data.count), data)
                let id = ULID.make(now: now)
                try tx.execute(
                    """
                    INSERT INTO team_task_attachments (id, task_id, filename, content_type, size_bytes, sha256, uploaded_by, uploaded_at)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                    """, id, taskID, filename, storedType, Int64(data.count), digest, uploader, now)
                try TeamTaskStore.journal(
                    tx, "team-task.attachment-added", task: taskID, at: now,
                    fields: [
                        ("attachment_id", .text(id)), ("sha256", .text(digest)), ("size_bytes", .int(Int64(data.count))),
                        ("content_type", .text(storedType)),
                    ],
                    personal: [Journal.Personal("uploaded_by", owner: uploader, uploader), Journal.Personal("filename", owner: uploader, filename)])
                var m = Tasks_V1_TeamTaskAttachment()
                m.attachmentId = id
                m.filename = filename
                m.contentType = storedType
                m.sizeBytes = Int64(data.count)
                m.sha256 = digest
                m.uploadedAt = Google_Protobuf_Timestamp(milliseconds: now)
                return .success((m, task.name))
            }
        } catch {
            reservation.release()  // not the token's fault (a full task, storage)
            throw error
        }
        switch result {
        case .failure(let problem):
            reservation.keep()
            throw Self.badToken(expired: problem == .expired)
        case .success(let (attachment, taskName)):
            reservation.release()
            var response = Tasks_V1_UploadTeamTaskAttachmentResponse()
            response.attachment = attachment
            response.taskName = taskName
            return response
        }
    }

    enum TokenProblem: Error { case unknown, expired }

    /// NOT_FOUND for a token that does not open any task (the caller keeps its reservation, so
    /// it counts against the address).
    static func badToken(expired: Bool) -> RPCError {
        expired
            ? RPCError(.notFound, "this upload token has expired (tokens last 24 hours): ask for a new one in the app")
            : RPCError(.notFound, "no task has this upload token: check the characters, or ask for a new token in the app")
    }

    public func getTeamTaskAttachment(
        request: Tasks_V1_GetTeamTaskAttachmentRequest, context: ServerContext
    ) async throws -> Tasks_V1_GetTeamTaskAttachmentResponse {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let id = FieldRules.id(request.taskId, field: "task_id", into: &errors)
        let attachment = FieldRules.id(request.attachmentId, field: "attachment_id", into: &errors)
        try errors.throwIfAny()
        let (meta, data) = try await core.read { c in
            _ = try TeamTaskStore.participating(c, task: id, user: me)
            guard
                let a = try c.queryOne(
                    "SELECT id, filename, content_type, size_bytes, sha256, uploaded_at FROM team_task_attachments WHERE id = ? AND task_id = ?",
                    attachment, id)
            else { throw RPCError(.notFound, "no such attachment on this task") }
            let meta = try TeamTaskStore.attachment(a)
            guard let blob = try c.queryOne("SELECT data FROM attachment_blobs WHERE sha256 = ?", meta.sha256) else {
                throw RPCError(.dataLoss, "the attachment's bytes are missing")
            }
            return (meta, try blob.get(0, as: [UInt8].self))
        }
        var response = Tasks_V1_GetTeamTaskAttachmentResponse()
        response.attachment = meta
        response.data = data
        return response
    }
}
