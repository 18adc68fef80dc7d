import Contracts
import Foundation
import RPCCore
import ServiceKit
import Storage

/// Team tasks in the database: reading tasks as a participant sees them, and the writes every
/// change shares (completion state, scoring once, the journal).
enum TeamTaskStore {
    /// The journal chain of team tasks.
    static let chain = "team-tasks"

    struct Participant: Sendable {
        var userID: String
        var completedAt: Int64?
    }

    struct Row: Sendable {
        var id: String
        var name: String
        var description: String
        var creatorID: String?
        var teamID: String
        var createdAt: Int64
        var completedAt: Int64?
        var scored: Bool
        var commentCount: Int
        var linkToken: String?
        var participants: [Participant]
        var attachments: [Tasks_V1_TeamTaskAttachment]

        var completedCount: Int { participants.filter { $0.completedAt != nil }.count }
        func isParticipant(_ user: String) -> Bool { participants.contains { $0.userID == user } }
        func participant(_ user: String) -> Participant? { participants.first { $0.userID == user } }
    }

    static let columns = "id, name, description, creator_id, team_id, created_at, completed_at, scored, comment_count, link_token"

    /// Tasks by id, with participants and attachment metadata, in the order of `ids`.
    static func load(_ db: some SQLReader, ids: [String]) throws -> [Row] {
        guard !ids.isEmpty else { return [] }
        let marks = Array(repeating: "?", count: ids.count).joined(separator: ",")
        let args = ids.map { DatabaseValue.text($0) }
        var byID: [String: Row] = [:]
        for r in try db.query("SELECT \(columns) FROM team_tasks WHERE id IN (\(marks))", arguments: args) {
            let id: String = try r.get("id")
            byID[id] = Row(
                id: id, name: try r.get("name"), description: try r.get("description"), creatorID: try r.get("creator_id"),
                teamID: try r.get("team_id"), createdAt: try r.get("created_at"), completedAt: try r.get("completed_at"),
                scored: try r.get("scored"), commentCount: try r.get("comment_count"), linkToken: try r.get("link_token"),
                participants: [], attachments: [])
        }
        for p in try db.query(
            "SELECT task_id, user_id, completed_at FROM team_task_participants WHERE task_id IN (\(marks)) ORDER BY task_id, position",
            arguments: args)
        {
            byID[try p.get("task_id")]?.participants.append(Participant(userID: try p.get("user_id"), completedAt: try p.get("completed_at")))
        }
        for a in try db.query(
            """
            SELECT id, task_id, filename, content_type, size_bytes, sha256, uploaded_at FROM team_task_attachments
            WHERE task_id IN (\(marks)) ORDER BY task_id, id
            """, arguments: args)
        {
            byID[try a.get("task_id")]?.attachments.append(try attachment(a))
        }
        return ids.compactMap { byID[$0] }
    }

    static func attachment(_ a: Storage.Row) throws -> Tasks_V1_TeamTaskAttachment {
        var m = Tasks_V1_TeamTaskAttachment()
        m.attachmentId = try a.get("id")
        m.filename = try a.get("filename")
        m.contentType = try a.get("content_type")
        m.sizeBytes = try a.get("size_bytes")
        m.sha256 = try a.get("sha256")
        m.uploadedAt = Google_Protobuf_Timestamp(milliseconds: try a.get("uploaded_at"))
        return m
    }

    /// The task if `user` participates in it; NOT_FOUND otherwise (no existence leak).
    static func participating(_ db: some SQLReader, task: String, user: String) throws -> Row {
        guard let row = try load(db, ids: [task]).first, row.isParticipant(user) else {
            throw RPCError(.notFound, "no such task (or you are not one of its participants)")
        }
        return row
    }

    /// The task as `viewer` sees it.
    static func proto(_ t: Row, viewer: String, users: [String: Common_V1_UserRef]) -> Tasks_V1_TeamTask {
        var m = Tasks_V1_TeamTask()
        m.taskId = t.id
        m.name = t.name
        m.description_p = t.description
        m.creator = users.ref(t.creatorID)
        m.participants = t.participants.map { p in
            var x = Tasks_V1_TeamTaskParticipant()
            x.user = users.ref(p.userID)
            x.completed = p.completedAt != nil
            if let at = p.completedAt { x.completedAt = Google_Protobuf_Timestamp(milliseconds: at) }
            return x
        }
        m.completedCount = Int32(t.completedCount)
        m.participantCount = Int32(t.participants.count)
        m.status = t.completedAt != nil ? .completed : .open
        m.completedByMe = t.participant(viewer)?.completedAt != nil
        m.commentCount = Int32(t.commentCount)
        m.attachments = t.attachments
        m.publicLinkToken = t.linkToken ?? ""
        m.createdAt = Google_Protobuf_Timestamp(milliseconds: t.createdAt)
        if let at = t.completedAt { m.completedAt = Google_Protobuf_Timestamp(milliseconds: at) }
        m.teamId = t.teamID
        return m
    }

    /// Every user a page of tasks shows.
    static func userIDs(_ rows: [Row]) -> [String] {
        rows.flatMap { r in r.participants.map(\.userID) + (r.creatorID.map { [$0] } ?? []) }
    }

    /// After participants or completions changed: sets or clears `completed_at` from the marks,
    /// and the first time the task becomes COMPLETED with a team, queues social's scoring (the
    /// `scored` flag makes it once, ever; social also counts a task once per team).
    static func settleCompletion(_ tx: Transaction, task: String, now: Int64, actor: String?) throws {
        guard let t = try load(tx, ids: [task]).first else { return }
        let all = !t.participants.isEmpty && t.completedCount == t.participants.count
        if all, t.completedAt == nil {
            try tx.execute("UPDATE team_tasks SET completed_at = ? WHERE id = ?", now, task)
            try journal(
                tx, "team-task.completed", task: task, at: now,
                fields: [("participant_count", .int(Int64(t.participants.count))), ("team_id", .text(t.teamID))],
                personal: actor.map { [Journal.Personal("completed_by", owner: $0, $0)] } ?? [])
            if !t.scored, !t.teamID.isEmpty {
                var r = Social_V1_RecordTeamTaskCompletedRequest()
                r.eventId = "tasks:team-task-completed:\(task)"
                r.teamId = t.teamID
                r.taskId = task
                r.points = 1
                try tx.enqueueCall(Social_V1_SocialInternalMethods.recordTeamTaskCompleted, r, eventID: r.eventId)
                try tx.execute("UPDATE team_tasks SET scored = 1 WHERE id = ?", task)
            }
        } else if !all, t.completedAt != nil {
            try tx.execute("UPDATE team_tasks SET completed_at = NULL WHERE id = ?", task)
            try journal(tx, "team-task.reopened", task: task, at: now, fields: [], personal: [])
        }
    }

    /// Appends to the team-task journal in this transaction.
    static func journal(
        _ tx: Transaction, _ kind: String, task: String, at: Int64, fields: [(name: String, value: Journal.Value)], personal: [Journal.Personal]
    ) throws {
        try Journal.append(tx, chain: chain, Journal.Record(kind: kind, subject: task, fields: fields, personal: personal), at: at)
    }

    /// Deletes a task with no participants left (its comments, attachments, tokens go with it;
    /// attachment bytes no other task uses too).
    static func deleteTask(_ tx: Transaction, task: String, now: Int64) throws {
        try tx.execute("DELETE FROM team_tasks WHERE id = ?", task)
        try tx.execute(
            "DELETE FROM attachment_blobs WHERE sha256 NOT IN (SELECT sha256 FROM team_task_attachments)")
        try journal(tx, "team-task.deleted", task: task, at: now, fields: [("reason", .text("no participants left"))], personal: [])
    }
}
