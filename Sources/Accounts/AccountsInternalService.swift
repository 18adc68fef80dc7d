import Contracts
import RPCCore
import ServiceKit
import Storage

/// `accounts.v1.AccountsInternal`: lookups for the other services, and the mail outbox. The access
/// interceptor lets only callers with the service credential in.
public struct AccountsInternalService: Accounts_V1_AccountsInternalService {
    let core: AccountsCore
    static let maxBatch = 200

    /// The distinct values in request order (exact duplicates ignored).
    static func distinct(_ values: [String]) -> [String] {
        var seen = Set<String>()
        return values.filter { seen.insert($0).inserted }
    }

    static func checkBatch(_ values: [String], field: String) throws {
        if values.isEmpty { throw FieldErrors.single(.invalidArgument, field: field, "at least one value is required") }
        if values.count > maxBatch { throw FieldErrors.single(.invalidArgument, field: field, "at most \(maxBatch) values") }
    }

    /// Checks the batch, then looks each distinct value up in one read: the references found by
    /// value, and the values not found (in request order).
    func lookUp(
        _ values: [String], field: String, _ find: @escaping @Sendable (Connection, String) throws -> UserRecord?
    )
        async throws -> (found: [String: Common_V1_UserRef], unknown: [String])
    {
        try Self.checkBatch(values, field: field)
        let distinct = Self.distinct(values)
        let records = try await core.read { c in try distinct.map { try find(c, $0) } }
        var found: [String: Common_V1_UserRef] = [:]
        var unknown: [String] = []
        for (value, user) in zip(distinct, records) {
            if let user { found[value] = user.reference } else { unknown.append(value) }
        }
        return (found, unknown)
    }

    public func getUsersByIds(request: Accounts_V1_GetUsersByIdsRequest, context: ServerContext) async throws -> Accounts_V1_GetUsersByIdsResponse {
        let (found, unknown) = try await lookUp(request.userIds, field: "user_ids") { c, id in try UserQueries.byID(c, id) }
        var response = Accounts_V1_GetUsersByIdsResponse()
        response.usersById = found
        response.unknownUserIds = unknown
        return response
    }

    public func resolveUsernames(
        request: Accounts_V1_ResolveUsernamesRequest, context: ServerContext
    ) async throws -> Accounts_V1_ResolveUsernamesResponse {
        let (found, unknown) = try await lookUp(request.usernames, field: "usernames") { c, name in
            try UserQueries.byUsername(c, AccountRules.trimmed(name))
        }
        var response = Accounts_V1_ResolveUsernamesResponse()
        response.usersByUsername = found
        response.unknownUsernames = unknown
        return response
    }

    public func resolveEmails(request: Accounts_V1_ResolveEmailsRequest, context: ServerContext) async throws -> Accounts_V1_ResolveEmailsResponse {
        let (found, unknown) = try await lookUp(request.emails, field: "emails") { c, email in
            try UserQueries.byEmail(c, AccountRules.trimmed(email))
        }
        var response = Accounts_V1_ResolveEmailsResponse()
        response.usersByEmail = found
        response.unknownEmails = unknown
        return response
    }

    // MARK: Sessions

    public func checkSessions(request: Accounts_V1_CheckSessionsRequest, context: ServerContext) async throws -> Accounts_V1_CheckSessionsResponse {
        let ids = Self.distinct(request.sessionIds)
        if ids.isEmpty || ids.count > 500 || ids.contains(where: { $0.isEmpty || $0.utf8.count > 64 }) {
            throw FieldErrors.single(.invalidArgument, field: "session_ids", "1 to 500 session ids of 1 to 64 characters each")
        }
        let live = try await core.read { c -> Set<String> in
            let marks = Array(repeating: "?", count: ids.count).joined(separator: ", ")
            let rows = try c.query(
                """
                SELECT s.id FROM sessions s JOIN users u ON u.id = s.user_id
                WHERE s.id IN (\(marks)) AND s.revoked_at IS NULL AND u.deleted_at IS NULL
                """, arguments: ids.map { .text($0) })
            return Set(try rows.map { try $0.get(0, as: String.self) })
        }
        var response = Accounts_V1_CheckSessionsResponse()
        response.endedSessionIds = ids.filter { !live.contains($0) }
        return response
    }

    // MARK: Mail

    public func sendMail(request: Accounts_V1_SendMailRequest, context: ServerContext) async throws -> Accounts_V1_SendMailResponse {
        var errors = FieldErrors()
        let eventID = request.eventId
        if eventID.isEmpty || AccountRules.length(eventID) > 64 { errors.add("event_id", "must be 1 to 64 characters") }
        if case .unspecified = request.kind { errors.add("kind", "required") }
        if case .unrecognized = request.kind { errors.add("kind", "unknown mail kind") }
        let to = AccountRules.email(request.toEmail, field: "to_email", into: &errors)
        let subject = AccountRules.trimmed(request.subject)
        if !(1...200).contains(AccountRules.length(subject)) { errors.add("subject", "must be 1 to 200 characters") }
        if !(1...10_000).contains(AccountRules.length(request.bodyText)) { errors.add("body_text", "must be 1 to 10000 characters") }
        for (key, value) in request.data.sorted(by: { $0.key < $1.key }) {
            if !(1...64).contains(AccountRules.length(key)) { errors.add("data", "keys must be 1 to 64 characters") }
            if AccountRules.length(value) > 1000 { errors.add("data[\(key)]", "must be at most 1000 characters") }
        }
        try errors.throwIfAny()

        guard core.sendMailInFlight.claim(eventID) else {
            throw RPCError(.unavailable, "this event is being delivered by another call: retry shortly")
        }
        defer { core.sendMailInFlight.release(eventID) }
        // Idempotent by event id: a 'sent' row is a replay; a 'pending' row is a delivery that
        // crashed half-way, finished now with the same mail id.
        let candidate = ULID.make()
        let (mailID, state) = try await core.write { tx -> (String, String) in
            try tx.execute(
                "INSERT OR IGNORE INTO mail_events (event_id, mail_id, state, created_at) VALUES (?, ?, 'pending', ?)",
                eventID, candidate, SystemClock.nowMilliseconds())
            let row = try tx.queryOne("SELECT mail_id, state FROM mail_events WHERE event_id = ?", eventID)!
            return (try row.get("mail_id"), try row.get("state"))
        }
        var response = Accounts_V1_SendMailResponse()
        response.mailId = mailID
        if state == "sent" {
            response.replayed = true
            return response
        }
        // A row made by this call (its own fresh id) cannot be in the mailbox yet: only a
        // delivery that crashed half-way needs the look.
        let delivered = mailID != candidate ? await core.mail.contains(mailID: mailID) : false
        if !delivered {
            let mail = MailMessage(
                mailID: mailID, kind: request.kind, from: core.configuration.mailFrom, to: to, subject: subject,
                body: request.bodyText, data: request.data, createdAt: SystemClock.nowMilliseconds())
            do { try await core.mail.deliver(mail) } catch {
                core.logger.error("mail not delivered", metadata: ["event": "\(eventID)", "error": "\(error)"])
                throw RPCError(.unavailable, "the mail could not be delivered now: retry later")
            }
        }
        try await core.write { tx in try tx.execute("UPDATE mail_events SET state = 'sent' WHERE event_id = ?", eventID) }
        return response
    }

    public func listSentMail(request: Accounts_V1_ListSentMailRequest, context: ServerContext) async throws -> Accounts_V1_ListSentMailResponse {
        var errors = FieldErrors()
        let to = AccountRules.key(AccountRules.trimmed(request.toEmail))
        let pageSize = AccountRules.pageSize(request.pageSize, into: &errors)
        let kind = request.kind
        if case .unrecognized = kind { errors.add("kind", "unknown mail kind") }
        let filters = "sent-mail:\(kind.rawValue):\(to)"
        var after: String?
        if !request.pageToken.isEmpty {
            after = core.pageTokens.open(request.pageToken, filters: filters, parts: 1)?.first
            if after == nil { errors.add("page_token", "not a page token of this listing (forged, or made for other filters)") }
        }
        try errors.throwIfAny()

        // Newest first: mail ids are ULIDs, which sort by creation time.
        let all = try await core.mail.readBack()
            .filter { (to.isEmpty || AccountRules.key($0.to) == to) && (kind == .unspecified || $0.kind == kind) }
            .filter { after == nil || $0.mailID < after! }
            .sorted { $0.mailID > $1.mailID }
        var response = Accounts_V1_ListSentMailResponse()
        response.mails = all.prefix(pageSize).map(\.proto)
        if all.count > pageSize, let last = response.mails.last {
            response.nextPageToken = core.pageTokens.make(cursor: [last.mailId], filters: filters)
        }
        return response
    }
}
