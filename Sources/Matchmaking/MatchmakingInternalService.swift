import Contracts
import RPCCore
import ServiceKit
import Storage
import Synchronization

/// `matchmaking.v1.MatchmakingInternal`: the account-deletion cascade.
public struct MatchmakingInternalService: Matchmaking_V1_MatchmakingInternalService {
    let core: MatchmakingCore

    /// Once per event id, in one transaction: the user's active matches end (ACCOUNT_DELETED: the
    /// opponent wins, unrated), their local matches and chat messages go, challenges to and from
    /// them are dropped, their statistics and rating are erased, and the finished matches their
    /// opponents keep show a "Deleted player". After the commit: the queue ticket and live
    /// streams end, the leaderboard forgets them.
    public func eraseUser(request: Matchmaking_V1_EraseUserRequest, context: ServerContext) async throws -> Matchmaking_V1_EraseUserResponse {
        let core = self.core
        let now = core.now(), configuration = core.configuration
        let effects = Mutex(Effects())
        let replayed = try await EraseUser.receive(eventID: request.eventId, userID: request.userId, store: core.store) { tx, user in
            var fx = Effects()
            // Local matches are the user's alone.
            let local = try tx.query("SELECT id FROM matches WHERE first_id = ? AND second_id = ?", user, user).map {
                try $0.get("id", as: String.self)
            }
            for id in local {
                try tx.execute("DELETE FROM match_moves WHERE match_id = ?", id)
                try tx.execute("DELETE FROM match_events WHERE match_id = ?", id)
                try tx.execute("DELETE FROM matches WHERE id = ?", id)
            }
            // Their matches: the event logs (which name the user) are dropped, so a watcher who
            // resumes gets a snapshot; the user is anonymised; their chat lines go.
            let others = try tx.query("SELECT id FROM matches WHERE first_id = ? OR second_id = ?", user, user).map {
                try $0.get("id", as: String.self)
            }
            for id in others { try tx.execute("DELETE FROM match_events WHERE match_id = ?", id) }
            // Active non-local matches end (after their logs went, so MatchOver is logged): the
            // opponent wins, unrated.
            let active = try tx.query(
                "SELECT \(MatchRecord.columns) FROM matches WHERE (first_id = ? OR second_id = ?) AND status = 1 AND kind != 1", user, user
            ).map(MatchRecord.init(row:))
            for var m in active {
                guard let seat = m.seat(of: user) else { continue }
                m.players[seat.index] = ""
                try MatchStore.finish(
                    tx, &m, winner: seat.other, reason: .accountDeleted, forfeit: seat, now: now, configuration: configuration, effects: &fx)
                try m.save(tx)
            }
            try tx.execute("UPDATE matches SET first_id = '' WHERE first_id = ?", user)
            try tx.execute("UPDATE matches SET second_id = '' WHERE second_id = ?", user)
            try tx.execute("DELETE FROM chat_messages WHERE sender_id = ?", user)
            try tx.execute("DELETE FROM challenges WHERE challenger_id = ? OR challenged_id = ?", user, user)
            try tx.execute("DELETE FROM ratings WHERE user_id = ?", user)
            try tx.execute("DELETE FROM stats WHERE user_id = ?", user)
            try tx.execute("DELETE FROM users WHERE id = ?", user)
            try tx.execute("INSERT OR IGNORE INTO erased_users (id, erased_at) VALUES (?, ?)", user, now)
            effects.withLock { $0 = fx }
        }
        if !replayed {
            core.apply(effects.withLock { $0 })
            core.queue.remove(userID: request.userId)
            core.ranks.remove(userID: request.userId)
            core.relations.forget(userID: request.userId)
            core.hub.close(userID: request.userId, RPCError(.unauthenticated, "this account was deleted"))
        }
        var r = Matchmaking_V1_EraseUserResponse()
        r.replayed = replayed
        return r
    }
}
