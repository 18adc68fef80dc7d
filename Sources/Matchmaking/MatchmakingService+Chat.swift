import Contracts
import GRPCContracts
import RPCCore
import ServiceKit
import Storage

extension MatchmakingService {
    // MARK: Chat (E 4.6)

    public func sendChatMessage(
        request: Matchmaking_V1_SendChatMessageRequest, context: ServerContext
    ) async throws -> Matchmaking_V1_SendChatMessageResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let id = Self.matchID(request.matchId, into: &errors)
        let text = FieldRules.text(request.text, field: "text", 1...200, into: &errors)
        FieldRules.idempotencyKey(request.idempotencyKey, into: &errors)
        try errors.throwIfAny()
        let now = core.now()
        let scope = "SendChatMessage:\(caller.userID)", key = request.idempotencyKey, fingerprint = Idempotency.fingerprint(request)
        // One read: a retry is answered from its key before any other check (the same key with
        // another request fails here, FAILED_PRECONDITION); else the match.
        let (stored, match) = try await core.store.read { c -> (Matchmaking_V1_SendChatMessageResponse?, MatchRecord?) in
            if let stored = try c.storedAnswer(scope: scope, key: key, fingerprint: fingerprint, as: Matchmaking_V1_SendChatMessageResponse.self) {
                return (stored, nil)
            }
            return (nil, try Self.playerMatch(c, id, caller.userID))
        }
        if var replay = stored {
            replay.replayed = true
            return replay
        }
        let m = match!
        if m.isLocal { throw RPCError(.failedPrecondition, "a local match has no chat") }
        guard m.isActive || m.windowOpen(now: now) else {
            throw RPCError(.failedPrecondition, "the chat of this match is closed (it is open while playing and 2 minutes after)")
        }
        let opponent = m.players[m.seat(of: caller.userID)!.other.index]
        if !opponent.isEmpty, try await core.relations.freshOrLastKnown(caller.userID, opponent).blocked {
            throw RPCError(.permissionDenied, "you cannot message this player")
        }
        switch core.chatThrottle.reserve("\(caller.userID)|\(id)") {
        case .success: break
        case .failure(let wait):
            let c = core.configuration
            throw RPCError.throttled("at most \(c.chatLimit) messages per \(c.chatWindow.components.seconds) seconds", wait: wait)
        }
        let messageID = ULID.make(now: now), hub = core.hub
        // The write checks the match again (it may have ended meanwhile) and settles concurrent
        // first tries of one key.
        let (response, replayed) = try await core.write { tx, effects in
            try tx.idempotent(scope: scope, key: key, fingerprint: fingerprint, now: now) {
                var m = try Self.playerMatch(tx, id, caller.userID)
                guard m.isActive || m.windowOpen(now: now) else { throw RPCError(.failedPrecondition, "the chat of this match is closed") }
                let seat = m.seat(of: caller.userID)!
                try tx.execute(
                    "INSERT INTO chat_messages (id, match_id, seat, sender_id, text, sent_at) VALUES (?, ?, ?, ?, ?, ?)", messageID, id,
                    seat.rawValue, caller.userID, text, now)
                let users = try UserNames.refs(tx, ids: m.players)
                var message = Matchmaking_V1_ChatMessage()
                message.messageId = messageID
                message.matchId = id
                message.seat = seat.proto
                message.sender = MatchRecord.ref(caller.userID, users)
                message.text = text
                message.sentAt = Google_Protobuf_Timestamp(milliseconds: now)
                let sent = message
                try MatchStore.appendEvent(tx, &m, now: now, effects: &effects) { $0.chatMessage = sent }
                try tx.execute("UPDATE matches SET last_sequence = ? WHERE id = ?", m.lastSequence, m.id)
                let other = m.players[seat.other.index]
                if !other.isEmpty, !hub.isWatching(matchID: id, userID: other) {
                    try Notify.send(
                        tx, eventID: "matchmaking:chat:\(messageID)", to: [other], kind: .matchChatMessage,
                        title: "\(Names.name(message.sender)): \(text)", actor: caller.userID, matchID: id)
                }
                var r = Matchmaking_V1_SendChatMessageResponse()
                r.message = message
                return r
            }
        }
        var out = response
        out.replayed = replayed
        return out
    }

    public func listChatMessages(
        request: Matchmaking_V1_ListChatMessagesRequest, context: ServerContext
    ) async throws -> Matchmaking_V1_ListChatMessagesResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let id = Self.matchID(request.matchId, into: &errors)
        let size = FieldRules.pageSize(request.pageSize, defaultSize: 100, maximum: 200, into: &errors)  // the contract: 1..200, 0 = 100
        let cursor = core.pageTokens.cursor(request.pageToken, filters: "chat:\(id)", parts: 1, into: &errors)
        try errors.throwIfAny()
        let messages = try await core.store.read { c -> [Matchmaking_V1_ChatMessage] in
            let m = try Self.playerMatch(c, id, caller.userID)
            let users = try UserNames.refs(c, ids: m.players)
            return try c.query(
                "SELECT id, seat, sender_id, text, sent_at FROM chat_messages WHERE match_id = ? AND id > ? ORDER BY id LIMIT ?", id,
                cursor?.first ?? "", size + 1
            ).map { row in
                var message = Matchmaking_V1_ChatMessage()
                message.messageId = try row.get("id")
                message.matchId = id
                message.seat = (try row.get("seat", as: Int.self)) == 2 ? .second : .first
                message.sender = MatchRecord.ref(try row.get("sender_id"), users)
                message.text = try row.get("text")
                message.sentAt = Google_Protobuf_Timestamp(milliseconds: try row.get("sent_at"))
                return message
            }
        }
        var r = Matchmaking_V1_ListChatMessagesResponse()
        r.messages = Array(messages.prefix(size))
        if messages.count > size, let last = r.messages.last {
            r.nextPageToken = core.pageTokens.make(cursor: [last.messageId], filters: "chat:\(id)")
        }
        return r
    }
}
