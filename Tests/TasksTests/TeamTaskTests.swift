import Contracts
import Foundation
import RPCCore
import Security
import ServiceKit
import ServiceKitTesting
import Storage
import Testing

@testable import Tasks

/// Team tasks over real gRPC: every RPC and every error team_tasks.proto names.
@Suite("Tasks: team tasks")
struct TeamTaskTests {
    @Test func createResolvesUsernamesAndNamesEveryUnknownOne() async throws {
        try await withWorld { w in
            let (alice, bob, carol) = (try await w.user("alice"), try await w.user("bob"), try await w.user("carol"))
            let team = try await w.team([alice])
            // Unknown usernames: each named by its index; nothing created.
            let f = await expectFailure(.invalidArgument, fields: ["participant_usernames[1]", "participant_usernames[3]"]) {
                try await w.tasks.createTeamTask(
                    createTask(with: [bob.username, "nobody_here", carol.username, "ghost"]), options: alice.options)
            }
            #expect(f?.message.contains("nobody_here") == true && f?.message.contains("ghost") == true)
            #expect(try await w.tasks.listMyTeamTasks(Tasks_V1_ListMyTeamTasksRequest(), options: alice.options).tasks.isEmpty)

            // Case-insensitive, duplicates and my own name ignored, creator first.
            let created = try await w.tasks.createTeamTask(
                createTask(
                    "Prepare sprint 12 demo", description: "Record the walkthrough",
                    with: [bob.username.uppercased(), bob.username, alice.username, carol.username]), options: alice.options)
            let t = created.task
            #expect(!created.replayed)
            #expect(t.participants.map(\.user.userId) == [alice.id, bob.id, carol.id])
            #expect(t.creator.userId == alice.id && t.creator.username == alice.username)
            #expect(t.participantCount == 3 && t.completedCount == 0 && t.status == .open && !t.completedByMe)
            #expect(t.teamId == team && t.publicLinkToken.isEmpty && t.attachments.isEmpty)
            #expect(t.description_p == "Record the walkthrough")
            // The other participants are notified (TASK_ASSIGNED) through the outbox.
            #expect(try await w.outboxDrained())
            // Once each in bob's and carol's inboxes at social, not in alice's.
            let (toBob, toCarol) = (
                try await w.notifications(to: bob, kind: .taskAssigned), try await w.notifications(to: carol, kind: .taskAssigned)
            )
            #expect(toBob.count == 1 && toCarol.count == 1)
            #expect(try await w.notifications(to: alice, kind: .taskAssigned).isEmpty)
            #expect(toBob.allSatisfy { $0.actorUserId == alice.id && $0.target.taskId == t.taskId })
            #expect(toCarol.allSatisfy { $0.actorUserId == alice.id && $0.target.taskId == t.taskId })
        }
    }

    @Test func createValidatesEveryField() async throws {
        try await withWorld { w in
            let alice = try await w.user("alice")
            var r = createTask(String(repeating: "x", count: 101), with: [""], key: "")
            r.description_p = String(repeating: "d", count: 2001)
            await expectFailure(.invalidArgument, fields: ["idempotency_key", "name", "description", "participant_usernames[0]"]) {
                try await w.tasks.createTeamTask(r, options: alice.options)
            }
            await expectFailure(.invalidArgument, fields: ["name"]) {
                try await w.tasks.createTeamTask(createTask("   ", with: []), options: alice.options)
            }
            await expectFailure(.invalidArgument, fields: ["participant_usernames"]) {
                try await w.tasks.createTeamTask(createTask(with: (0..<50).map { "u\($0)" }), options: alice.options)
            }
            // No token → UNAUTHENTICATED; a forged one too.
            await expectFailure(.unauthenticated) { try await w.tasks.createTeamTask(createTask(with: [])) }
            await expectFailure(.unauthenticated) { try await w.tasks.createTeamTask(createTask(with: []), options: bearer("not-a-token")) }
        }
    }

    @Test func retriedCreateCreatesNothingTwiceEvenConcurrently() async throws {
        try await withWorld { w in
            let (alice, bob) = (try await w.user("alice"), try await w.user("bob"))
            let r = createTask(with: [bob.username], key: "retry-key-1")
            async let a = w.tasks.createTeamTask(r, options: alice.options)
            async let b = w.tasks.createTeamTask(r, options: alice.options)
            let (x, y) = try await (a, b)
            #expect(x.task.taskId == y.task.taskId)
            #expect([x.replayed, y.replayed].filter { $0 }.count == 1)
            let again = try await w.tasks.createTeamTask(r, options: alice.options)
            #expect(again.replayed && again.task.taskId == x.task.taskId)
            #expect(try await w.tasks.listMyTeamTasks(Tasks_V1_ListMyTeamTasksRequest(), options: alice.options).tasks.count == 1)
            // Same key, another request → FAILED_PRECONDITION naming the key.
            await expectFailure(.failedPrecondition, fields: ["idempotency_key"]) {
                try await w.tasks.createTeamTask(createTask("Other", with: [bob.username], key: "retry-key-1"), options: alice.options)
            }
            // The key is the caller's: bob may use the same one.
            #expect(!(try await w.tasks.createTeamTask(createTask(with: [], key: "retry-key-1"), options: bob.options).replayed))
        }
    }

    @Test func listsToDoAndCompletedNewestFirstWithPages() async throws {
        try await withWorld { w in
            let (alice, bob) = (try await w.user("alice"), try await w.user("bob"))
            var ids: [String] = []
            for i in 0..<5 {
                w.clock.advance(by: .seconds(1))
                ids.append(try await w.tasks.createTeamTask(createTask("Task \(i)", with: [bob.username]), options: alice.options).task.taskId)
            }
            var done = Tasks_V1_SetTeamTaskCompletionRequest()
            done.taskId = ids[1]
            done.completed = true
            _ = try await w.tasks.setTeamTaskCompletion(done, options: alice.options)

            var list = Tasks_V1_ListMyTeamTasksRequest()
            list.view = .toDo
            list.pageSize = 2
            var seen: [String] = []
            repeat {
                let page = try await w.tasks.listMyTeamTasks(list, options: alice.options)
                #expect(page.tasks.count <= 2)
                seen += page.tasks.map(\.taskId)
                list.pageToken = page.nextPageToken
            } while !list.pageToken.isEmpty
            #expect(seen == [ids[4], ids[3], ids[2], ids[0]])
            list = Tasks_V1_ListMyTeamTasksRequest()
            list.view = .completed
            let completed = try await w.tasks.listMyTeamTasks(list, options: alice.options).tasks
            #expect(completed.map(\.taskId) == [ids[1]] && completed[0].completedByMe && completed[0].completedCount == 1)
            // bob has not completed anything: all five are in his To Do.
            list.view = .toDo
            #expect(try await w.tasks.listMyTeamTasks(list, options: bob.options).tasks.count == 5)
            // A token of another view, or a forged one → INVALID_ARGUMENT naming page_token.
            var p = Tasks_V1_ListMyTeamTasksRequest()
            p.view = .toDo
            p.pageSize = 1
            let token = try await w.tasks.listMyTeamTasks(p, options: alice.options).nextPageToken
            p.view = .completed
            p.pageToken = token
            await expectFailure(.invalidArgument, fields: ["page_token"]) { try await w.tasks.listMyTeamTasks(p, options: alice.options) }
            p.pageToken = "forged.token"
            await expectFailure(.invalidArgument, fields: ["page_token"]) { try await w.tasks.listMyTeamTasks(p, options: alice.options) }
            p = Tasks_V1_ListMyTeamTasksRequest()
            p.pageSize = -1
            await expectFailure(.invalidArgument, fields: ["page_size"]) { try await w.tasks.listMyTeamTasks(p, options: alice.options) }
        }
    }

    @Test func detailCommentsAndParticipantsOnly() async throws {
        try await withWorld { w in
            let (alice, bob, mallory) = (try await w.user("alice"), try await w.user("bob"), try await w.user("mallory"))
            let t = try await w.tasks.createTeamTask(createTask(with: [bob.username]), options: alice.options).task
            var get = Tasks_V1_GetTeamTaskRequest()
            get.taskId = t.taskId
            #expect(try await w.tasks.getTeamTask(get, options: bob.options).task.name == t.name)
            // Not a participant → NOT_FOUND, exactly as for an unknown id.
            await expectFailure(.notFound) { try await w.tasks.getTeamTask(get, options: mallory.options) }
            get.taskId = "tt_unknown"
            await expectFailure(.notFound) { try await w.tasks.getTeamTask(get, options: alice.options) }
            get.taskId = ""
            await expectFailure(.invalidArgument, fields: ["task_id"]) { try await w.tasks.getTeamTask(get, options: alice.options) }

            var c = Tasks_V1_AddTeamTaskCommentRequest()
            c.idempotencyKey = "c1"
            c.taskId = t.taskId
            c.text = "  <script>alert(1)</script> I'll record it  "
            let first = try await w.tasks.addTeamTaskComment(c, options: bob.options)
            #expect(first.comment.text == "<script>alert(1)</script> I'll record it" && first.comment.author.userId == bob.id && !first.replayed)
            #expect(try await w.tasks.addTeamTaskComment(c, options: bob.options).replayed)
            c.idempotencyKey = "c2"
            c.text = "Thanks!"
            _ = try await w.tasks.addTeamTaskComment(c, options: alice.options)
            await expectFailure(.notFound) { try await w.tasks.addTeamTaskComment(c, options: mallory.options) }
            c.text = "   "
            await expectFailure(.invalidArgument, fields: ["text"]) { try await w.tasks.addTeamTaskComment(c, options: alice.options) }

            var list = Tasks_V1_ListTeamTaskCommentsRequest()
            list.taskId = t.taskId
            list.pageSize = 1
            let page1 = try await w.tasks.listTeamTaskComments(list, options: alice.options)
            list.pageToken = page1.nextPageToken
            let page2 = try await w.tasks.listTeamTaskComments(list, options: alice.options)
            #expect(page1.comments.map(\.text) + page2.comments.map(\.text) == [first.comment.text, "Thanks!"])
            #expect(page2.nextPageToken.isEmpty)
            await expectFailure(.notFound) { try await w.tasks.listTeamTaskComments(list, options: mallory.options) }
            get.taskId = t.taskId
            #expect(try await w.tasks.getTeamTask(get, options: alice.options).task.commentCount == 2)
            // TASK_COMMENT for the others only, once per comment (the replay queued nothing).
            #expect(try await w.outboxDrained())
            #expect(try await w.notifications(to: alice, kind: .taskComment).count == 1)
            #expect(try await w.notifications(to: bob, kind: .taskComment).count == 1)
        }
    }

    @Test func optOutAndCompletionScoreExactlyOnce() async throws {
        try await withWorld { w in
            let (alice, bob, carol) = (try await w.user("alice"), try await w.user("bob"), try await w.user("carol"))
            _ = try await w.team([alice, bob, carol])
            let t = try await w.tasks.createTeamTask(createTask(with: [bob.username, carol.username]), options: alice.options).task
            var opt = Tasks_V1_OptOutOfTeamTaskRequest()
            opt.taskId = t.taskId
            await expectFailure(.failedPrecondition) { try await w.tasks.optOutOfTeamTask(opt, options: alice.options) }
            _ = try await w.tasks.optOutOfTeamTask(opt, options: carol.options)
            await expectFailure(.notFound) { try await w.tasks.optOutOfTeamTask(opt, options: carol.options) }
            #expect(try await w.tasks.listMyTeamTasks(Tasks_V1_ListMyTeamTasksRequest(), options: carol.options).tasks.isEmpty)

            var set = Tasks_V1_SetTeamTaskCompletionRequest()
            set.taskId = t.taskId
            set.completed = true
            var after = try await w.tasks.setTeamTaskCompletion(set, options: alice.options).task
            #expect(after.completedCount == 1 && after.participantCount == 2 && after.status == .open && after.completedByMe)
            _ = try await w.tasks.setTeamTaskCompletion(set, options: alice.options)  // no-op
            await expectFailure(.notFound) { try await w.tasks.setTeamTaskCompletion(set, options: carol.options) }
            // Two "last" completions racing: bob's twice at once.
            let bobDone = set
            async let x = w.tasks.setTeamTaskCompletion(bobDone, options: bob.options)
            async let y = w.tasks.setTeamTaskCompletion(bobDone, options: bob.options)
            _ = try await (x, y)
            var get = Tasks_V1_GetTeamTaskRequest()
            get.taskId = t.taskId
            after = try await w.tasks.getTeamTask(get, options: bob.options).task
            #expect(after.status == .completed && after.completedCount == 2 && after.hasCompletedAt)
            // Withdraw and complete again: reopened, completed, still scored once.
            set.completed = false
            #expect(try await w.tasks.setTeamTaskCompletion(set, options: bob.options).task.status == .open)
            set.completed = true
            #expect(try await w.tasks.setTeamTaskCompletion(set, options: bob.options).task.status == .completed)
            #expect(try await w.outboxDrained())
            #expect(try await w.teamScore(of: alice) == 1)
            // tasks queued one scoring call in all (social would also refuse to score a task twice).
            let path = Social_V1_SocialInternalMethods.recordTeamTaskCompleted.path
            let scoringCalls = try await w.core.read { c in
                try c.queryOne("SELECT COUNT(*) FROM outbox WHERE kind = ?", path)!.get(0, as: Int64.self)
            }
            #expect(scoringCalls == 1)
        }
    }

    @Test func helpNotifiesTheOthersOrFailsWhenAlone() async throws {
        try await withWorld { w in
            let (alice, bob, carol, mallory) = (try await w.user("alice"), try await w.user("bob"), try await w.user("carol"), try await w.user("m"))
            let solo = try await w.tasks.createTeamTask(createTask(with: []), options: alice.options).task
            var help = Tasks_V1_RequestTeamTaskHelpRequest()
            help.taskId = solo.taskId
            await expectFailure(.failedPrecondition) { try await w.tasks.requestTeamTaskHelp(help, options: alice.options) }
            var offer = Tasks_V1_OfferTeamTaskHelpRequest()
            offer.taskId = solo.taskId
            await expectFailure(.failedPrecondition) { try await w.tasks.offerTeamTaskHelp(offer, options: alice.options) }

            let t = try await w.tasks.createTeamTask(createTask(with: [bob.username, carol.username]), options: alice.options).task
            help.taskId = t.taskId
            help.message = "Stuck on the <b>video</b> export"
            #expect(try await w.tasks.requestTeamTaskHelp(help, options: alice.options).notifiedCount == 2)
            offer.taskId = t.taskId
            #expect(try await w.tasks.offerTeamTaskHelp(offer, options: bob.options).notifiedCount == 2)
            await expectFailure(.notFound) { try await w.tasks.requestTeamTaskHelp(help, options: mallory.options) }
            help.message = String(repeating: "m", count: 201)
            await expectFailure(.invalidArgument, fields: ["message"]) { try await w.tasks.requestTeamTaskHelp(help, options: alice.options) }
            #expect(try await w.outboxDrained())
            // The request reached bob and carol once each (not alice); the offer alice and carol (not bob).
            for who in [bob, carol] {
                let requests = try await w.notifications(to: who, kind: .helpRequest)
                #expect(requests.count == 1 && requests[0].body == "Stuck on the <b>video</b> export" && requests[0].actorUserId == alice.id)
            }
            #expect(try await w.notifications(to: alice, kind: .helpRequest).isEmpty)
            for who in [alice, carol] {
                let offers = try await w.notifications(to: who, kind: .helpOffer)
                #expect(offers.count == 1 && offers[0].actorUserId == bob.id)
            }
            #expect(try await w.notifications(to: bob, kind: .helpOffer).isEmpty)
        }
    }

    @Test func publicLinkNeedsMyCompletionIsStableAndRevocable() async throws {
        try await withWorld { w in
            let (alice, bob) = (try await w.user("alice", displayName: "Alice Martin"), try await w.user("bob", displayName: ""))
            let t = try await w.tasks.createTeamTask(createTask(description: "Line one\nLine two", with: [bob.username]), options: alice.options).task
            var link = Tasks_V1_CreateTeamTaskLinkRequest()
            link.taskId = t.taskId
            await expectFailure(.failedPrecondition) { try await w.tasks.createTeamTaskLink(link, options: alice.options) }
            var set = Tasks_V1_SetTeamTaskCompletionRequest()
            set.taskId = t.taskId
            set.completed = true
            _ = try await w.tasks.setTeamTaskCompletion(set, options: alice.options)
            let l1 = try await w.tasks.createTeamTaskLink(link, options: alice.options)
            #expect(l1.linkToken.count == 43 && l1.publicPath == "/t/\(l1.linkToken)")
            #expect(try await w.tasks.createTeamTaskLink(link, options: alice.options).linkToken == l1.linkToken)
            var get = Tasks_V1_GetTeamTaskRequest()
            get.taskId = t.taskId
            #expect(try await w.tasks.getTeamTask(get, options: bob.options).task.publicLinkToken == l1.linkToken)

            // Anyone with the token (no credentials at all) reads the public view, nothing more.
            var pub = Tasks_V1_GetPublicTeamTaskRequest()
            pub.linkToken = l1.linkToken
            let view = try await w.tasks.getPublicTeamTask(pub).task
            #expect(view.name == t.name && view.description_p == "Line one\nLine two")
            #expect(view.participantNames == ["Alice Martin", bob.username])
            #expect(view.completedCount == 1 && view.participantCount == 2 && view.status == .open && !view.hasCompletedAt)
            pub.linkToken = String(l1.linkToken.dropLast()) + (l1.linkToken.hasSuffix("A") ? "B" : "A")
            await expectFailure(.notFound) { try await w.tasks.getPublicTeamTask(pub) }
            pub.linkToken = "short"
            await expectFailure(.notFound) { try await w.tasks.getPublicTeamTask(pub) }
            pub.linkToken = ""
            await expectFailure(.invalidArgument, fields: ["link_token"]) { try await w.tasks.getPublicTeamTask(pub) }

            var revoke = Tasks_V1_RevokeTeamTaskLinkRequest()
            revoke.taskId = t.taskId
            #expect(try await w.tasks.revokeTeamTaskLink(revoke, options: bob.options).revoked)
            #expect(!(try await w.tasks.revokeTeamTaskLink(revoke, options: bob.options).revoked))
            pub.linkToken = l1.linkToken
            await expectFailure(.notFound) { try await w.tasks.getPublicTeamTask(pub) }
            let l2 = try await w.tasks.createTeamTaskLink(link, options: alice.options)
            #expect(l2.linkToken != l1.linkToken)
            await expectFailure(.failedPrecondition) { try await w.tasks.createTeamTaskLink(link, options: bob.options) }
        }
    }

    @Test func attachmentsWithUploadTokensByteForByte() async throws {
        try await withWorld { w in
            let (alice, bob, mallory) = (try await w.user("alice"), try await w.user("bob"), try await w.user("mallory"))
            let t = try await w.tasks.createTeamTask(createTask(with: [bob.username]), options: alice.options).task
            var mk = Tasks_V1_CreateTeamTaskUploadTokenRequest()
            mk.taskId = t.taskId
            await expectFailure(.notFound) { try await w.tasks.createTeamTaskUploadToken(mk, options: mallory.options) }
            let tok = try await w.tasks.createTeamTaskUploadToken(mk, options: bob.options)
            #expect(tok.uploadToken.count == 10 && tok.uploadToken.dropFirst(4).first == "-")
            #expect(tok.expiresAt.milliseconds == w.clock.nowMilliseconds() + 24 * 3600 * 1000)

            // 5 MiB exactly, through gRPC with no credentials: the token is the credential.
            var bytes = SecureRandom.bytes(5 * 1024 * 1024)
            bytes.replaceSubrange(0..<5, with: Array("%PDF-".utf8))
            var up = Tasks_V1_UploadTeamTaskAttachmentRequest()
            up.uploadToken = tok.uploadToken.lowercased().replacingOccurrences(of: "-", with: " ")  // as a person types it
            up.filename = "sprint <12> notes.pdf"
            up.contentType = "application/pdf"
            up.data = bytes
            let stored = try await w.tasks.uploadTeamTaskAttachment(up)
            #expect(stored.taskName == t.name && stored.attachment.sizeBytes == Int64(bytes.count))
            #expect(stored.attachment.sha256 == HashChain.hex(SHA256.hash(bytes)))
            var get = Tasks_V1_GetTeamTaskAttachmentRequest()
            get.taskId = t.taskId
            get.attachmentId = stored.attachment.attachmentId
            let back = try await w.tasks.getTeamTaskAttachment(get, options: alice.options)
            #expect(back.data == bytes)
            #expect(back.attachment.filename == "sprint <12> notes.pdf" && back.attachment.contentType == "application/pdf")
            await expectFailure(.notFound) { try await w.tasks.getTeamTaskAttachment(get, options: mallory.options) }
            get.attachmentId = "att_nope"
            await expectFailure(.notFound) { try await w.tasks.getTeamTaskAttachment(get, options: alice.options) }

            // Same bytes again (reusable token): stored once, content-addressed.
            up.filename = "copy.pdf"
            _ = try await w.tasks.uploadTeamTaskAttachment(up)
            #expect(try await w.core.read { c in try c.queryOne("SELECT COUNT(*) FROM attachment_blobs")!.get(0, as: Int64.self) } == 1)
            var detail = Tasks_V1_GetTeamTaskRequest()
            detail.taskId = t.taskId
            #expect(
                try await w.tasks.getTeamTask(detail, options: alice.options).task.attachments.map(\.filename) == [
                    "sprint <12> notes.pdf", "copy.pdf",
                ])

            // Refusals, each naming its field.
            var bad = up
            bad.data = []
            await expectFailure(.invalidArgument, fields: ["data"]) { try await w.tasks.uploadTeamTaskAttachment(bad) }
            bad = up
            bad.filename = "../../etc/passwd"
            await expectFailure(.invalidArgument, fields: ["filename"]) { try await w.tasks.uploadTeamTaskAttachment(bad) }
            bad.filename = "report\u{7}\n.pdf"
            await expectFailure(.invalidArgument, fields: ["filename"]) { try await w.tasks.uploadTeamTaskAttachment(bad) }
            bad.filename = "\u{202E}fdp.exe"  // right-to-left override: a format character
            await expectFailure(.invalidArgument, fields: ["filename"]) { try await w.tasks.uploadTeamTaskAttachment(bad) }
            bad = up
            bad.contentType = "text/html"
            bad.data = Array("<html><script>alert(1)</script>".utf8)
            await expectFailure(.invalidArgument, fields: ["content_type"]) { try await w.tasks.uploadTeamTaskAttachment(bad) }
            bad = up
            bad.contentType = "image/png"
            await expectFailure(.invalidArgument, fields: ["content_type"]) { try await w.tasks.uploadTeamTaskAttachment(bad) }
            bad = up
            bad.data = Array("%PDF-".utf8) + [UInt8](repeating: 1, count: 5 * 1024 * 1024)
            // Over 5 MiB: refused by the method's size limit before the service reads it, or by the rule.
            do {
                _ = try await w.tasks.uploadTeamTaskAttachment(bad)
                Issue.record("an attachment over 5 MiB was accepted")
            } catch let e as RPCError {
                #expect(e.code == .invalidArgument || e.code == .resourceExhausted, "\(e)")
            }
            bad = up
            bad.uploadToken = "ZZZZ-ZZZZZ"
            let unknown = await expectFailure(.notFound) { try await w.tasks.uploadTeamTaskAttachment(bad) }
            #expect(unknown?.message.contains("no task has this upload token") == true)
            bad.uploadToken = "not a token at all!"
            await expectFailure(.notFound) { try await w.tasks.uploadTeamTaskAttachment(bad) }

            // Expired after 24 h (the clock moves, nothing sleeps).
            w.clock.advance(by: .seconds(24 * 3600 + 1))
            let expired = await expectFailure(.notFound) { try await w.tasks.uploadTeamTaskAttachment(up) }
            #expect(expired?.message.contains("expired") == true)
        }
    }

    @Test func attachmentLimitPerTaskAndWrongTokenThrottle() async throws {
        try await withWorld({ $0.maxBadUploadTokensPerAddress = 3 }) { w in
            let alice = try await w.user("alice")
            let t = try await w.tasks.createTeamTask(createTask(with: []), options: alice.options).task
            var mk = Tasks_V1_CreateTeamTaskUploadTokenRequest()
            mk.taskId = t.taskId
            let tok = try await w.tasks.createTeamTaskUploadToken(mk, options: alice.options).uploadToken
            var up = Tasks_V1_UploadTeamTaskAttachmentRequest()
            up.uploadToken = tok
            up.filename = "n.txt"
            up.contentType = "text/plain"
            for i in 0..<20 {
                up.data = Array("note \(i)".utf8)
                _ = try await w.tasks.uploadTeamTaskAttachment(up)
            }
            up.data = Array("one too many".utf8)
            await expectFailure(.resourceExhausted) { try await w.tasks.uploadTeamTaskAttachment(up) }
            // Guessing tokens: after 3 wrong ones from this address, even a right one waits.
            up.uploadToken = "AAAA-AAAAA"
            for _ in 0..<3 { await expectFailure(.notFound) { try await w.tasks.uploadTeamTaskAttachment(up) } }
            let f = await expectFailure(.resourceExhausted) { try await w.tasks.uploadTeamTaskAttachment(up) }
            #expect((f?.retryDelaySeconds ?? 0) > 0)
        }
    }

    @Test func concurrentWrongUploadTokensAreCountedBeforeTheyAreLookedUp() async throws {
        try await withWorld({ $0.maxBadUploadTokensPerAddress = 5 }) { w in
            var up = Tasks_V1_UploadTeamTaskAttachmentRequest()
            up.uploadToken = "AAAA-AAAAA"
            up.filename = "n.txt"
            up.contentType = "text/plain"
            up.data = Array("guess".utf8)
            let request = up
            let codes = await withTaskGroup(of: StatusCode?.self) { group in
                for _ in 0..<40 {
                    group.addTask {
                        do { _ = try await w.tasks.uploadTeamTaskAttachment(request) } catch let e as RPCError { return e.code } catch {}
                        return nil
                    }
                }
                return await group.reduce(into: [StatusCode?]()) { $0.append($1) }
            }
            #expect(codes.filter { $0 == .notFound }.count <= 5, "at most the limit were looked up")
            #expect(codes.filter { $0 == .resourceExhausted }.count >= 35)
        }
    }

    @Test func journalRecordsEveryChangeAndNamesTheFirstBrokenLink() async throws {
        try await withWorld { w in
            let (alice, bob) = (try await w.user("alice"), try await w.user("bob"))
            let t = try await w.tasks.createTeamTask(createTask(with: [bob.username]), options: alice.options).task
            var c = Tasks_V1_AddTeamTaskCommentRequest()
            c.idempotencyKey = "k"
            c.taskId = t.taskId
            c.text = "hello"
            _ = try await w.tasks.addTeamTaskComment(c, options: bob.options)
            var set = Tasks_V1_SetTeamTaskCompletionRequest()
            set.taskId = t.taskId
            set.completed = true
            _ = try await w.tasks.setTeamTaskCompletion(set, options: alice.options)
            _ = try await w.tasks.setTeamTaskCompletion(set, options: bob.options)
            var mk = Tasks_V1_CreateTeamTaskUploadTokenRequest()
            mk.taskId = t.taskId
            var up = Tasks_V1_UploadTeamTaskAttachmentRequest()
            up.uploadToken = try await w.tasks.createTeamTaskUploadToken(mk, options: alice.options).uploadToken
            up.filename = "a.txt"
            up.data = Array("abc".utf8)
            _ = try await w.tasks.uploadTeamTaskAttachment(up)

            let entries = try await w.core.read { c in try Journal.entries(c, chain: TeamTaskStore.chain, subject: t.taskId) }
            #expect(
                entries.map(\.record.kind) == [
                    "team-task.created", "team-task.comment-added", "team-task.completion-marked", "team-task.completion-marked",
                    "team-task.completed", "team-task.attachment-added",
                ])
            #expect(entries.last?.record.fields.first { $0.name == "sha256" }?.value == .text(HashChain.hex(SHA256.hash(Array("abc".utf8)))))
            var ok = try await w.internalAPI.verifyJournal(Tasks_V1_VerifyJournalRequest())
            #expect(ok.intact && ok.checkedEntries == 6 && ok.headHash.count == 64 && ok.firstBrokenSequence == 0)
            // Only the service credential opens it.
            await expectFailure(.permissionDenied) {
                try await Tasks_V1_TasksInternalClient(w.server.gateway).verifyJournal(Tasks_V1_VerifyJournalRequest())
            }

            // Someone edits the third entry's body behind the service's back: named.
            try await w.core.write { tx in
                try tx.execute(
                    "UPDATE journal_entries SET body = ? WHERE chain = ? AND seq = 3", Journal.encodeFields([("forged", .bool(true))]),
                    TeamTaskStore.chain)
            }
            var broken = try await w.internalAPI.verifyJournal(Tasks_V1_VerifyJournalRequest())
            #expect(!broken.intact && broken.firstBrokenSequence == 3 && broken.firstBrokenEntryId == entries[2].entryID)
            #expect(broken.problem.contains("does not match its hash"))
            #expect(broken.headHash.isEmpty)
            // A changed personal value (the comment's text) is named too.
            let original = entries[2]
            try await w.core.write { tx in
                let fields = Journal.encodeFields(original.record.fields)
                try tx.execute("UPDATE journal_entries SET body = ? WHERE chain = ? AND seq = 3", fields, TeamTaskStore.chain)
                try tx.execute("UPDATE journal_values SET value = 'goodbye' WHERE chain = ? AND seq = 2 AND name = 'text'", TeamTaskStore.chain)
            }
            broken = try await w.internalAPI.verifyJournal(Tasks_V1_VerifyJournalRequest())
            #expect(broken.firstBrokenSequence == 2 && broken.problem.contains("text does not match"))
            try await w.core.write { tx in
                try tx.execute("UPDATE journal_values SET value = 'hello' WHERE chain = ? AND seq = 2 AND name = 'text'", TeamTaskStore.chain)
            }
            ok = try await w.internalAPI.verifyJournal(Tasks_V1_VerifyJournalRequest())
            #expect(ok.intact)
            // A removed last entry: the head no longer matches.
            try await w.core.write { tx in try tx.execute("DELETE FROM journal_values WHERE chain = ? AND seq = 6", TeamTaskStore.chain) }
            try await w.core.write { tx in try tx.execute("DELETE FROM journal_entries WHERE chain = ? AND seq = 6", TeamTaskStore.chain) }
            broken = try await w.internalAPI.verifyJournal(Tasks_V1_VerifyJournalRequest())
            #expect(!broken.intact && broken.problem.contains("head"))
        }
    }

    @Test func eraseUserKeepsOthersTasksAndTheJournalVerifying() async throws {
        try await withWorld { w in
            let (alice, bob, carol) = (try await w.user("alice"), try await w.user("bob"), try await w.user("carol"))
            _ = try await w.team([alice])
            let t = try await w.tasks.createTeamTask(createTask(with: [bob.username, carol.username]), options: alice.options).task
            let solo = try await w.tasks.createTeamTask(createTask("Alone", with: []), options: alice.options).task
            var c = Tasks_V1_AddTeamTaskCommentRequest()
            c.idempotencyKey = "k"
            c.taskId = t.taskId
            c.text = "alice was here"
            _ = try await w.tasks.addTeamTaskComment(c, options: alice.options)
            var set = Tasks_V1_SetTeamTaskCompletionRequest()
            set.taskId = t.taskId
            set.completed = true
            _ = try await w.tasks.setTeamTaskCompletion(set, options: bob.options)
            _ = try await w.tasks.setTeamTaskCompletion(set, options: carol.options)
            var mk = Tasks_V1_CreateTeamTaskUploadTokenRequest()
            mk.taskId = t.taskId
            let aliceToken = try await w.tasks.createTeamTaskUploadToken(mk, options: alice.options).uploadToken

            var erase = Tasks_V1_EraseUserRequest()
            erase.eventId = "accounts:user-deleted:1"
            erase.userId = alice.id
            #expect(!(try await w.internalAPI.eraseUser(erase)).replayed)
            #expect(try await w.internalAPI.eraseUser(erase).replayed)
            erase.eventId = ""
            await expectFailure(.invalidArgument, fields: ["event_id"]) { try await w.internalAPI.eraseUser(erase) }
            await expectFailure(.permissionDenied) { try await Tasks_V1_TasksInternalClient(w.server.gateway).eraseUser(erase) }

            var get = Tasks_V1_GetTeamTaskRequest()
            get.taskId = t.taskId
            let kept = try await w.tasks.getTeamTask(get, options: bob.options).task
            #expect(kept.creator.userId.isEmpty && kept.creator.username == "deleted-user")
            #expect(kept.participants.map(\.user.userId) == [bob.id, carol.id])
            // The two left had both completed: the task is complete now, and scored once.
            #expect(kept.status == .completed && kept.completedCount == 2)
            var comments = Tasks_V1_ListTeamTaskCommentsRequest()
            comments.taskId = t.taskId
            let kc = try await w.tasks.listTeamTaskComments(comments, options: bob.options).comments
            #expect(kc.count == 1 && kc[0].text == "alice was here" && kc[0].author.userId.isEmpty && kc[0].author.username == "deleted-user")
            // Her own task (no one else in it) is gone; her upload token too.
            get.taskId = solo.taskId
            await expectFailure(.notFound) { try await w.tasks.getTeamTask(get, options: alice.options) }
            var up = Tasks_V1_UploadTeamTaskAttachmentRequest()
            up.uploadToken = aliceToken
            up.filename = "x.txt"
            up.data = [1]
            await expectFailure(.notFound) { try await w.tasks.uploadTeamTaskAttachment(up) }
            // Her personal values left the journal; the chain still verifies.
            let left = try await w.core.read { c in
                try c.queryOne("SELECT COUNT(*) FROM journal_values WHERE owner = ? AND value IS NOT NULL", alice.id)!.get(0, as: Int64.self)
            }
            #expect(left == 0)
            let v = try await w.internalAPI.verifyJournal(Tasks_V1_VerifyJournalRequest())
            #expect(v.intact && v.erasedValues > 0)
            #expect(try await w.outboxDrained())
            #expect(try await w.teamScore(of: alice) == 1)
        }
    }

    @Test func peerDownGivesAClearAnswerAndCreatesNothing() async throws {
        try await withWorld({ $0.peerDeadline = .milliseconds(300) }) { w in
            let (alice, bob) = (try await w.user("alice"), try await w.user("bob"))
            w.setSocialDown(true)
            let f = await expectFailure(.unavailable) { try await w.tasks.createTeamTask(createTask(with: [bob.username]), options: alice.options) }
            #expect(f?.message.contains("social") == true && f?.message.contains("nothing was created") == true)
            #expect(try await w.tasks.listMyTeamTasks(Tasks_V1_ListMyTeamTasksRequest(), options: alice.options).tasks.isEmpty)
            w.setSocialDown(false)
            let t = try await w.tasks.createTeamTask(createTask(with: [bob.username]), options: alice.options).task
            // social down: notifications wait in the outbox and arrive once it is back.
            w.setSocialDown(true)
            var help = Tasks_V1_RequestTeamTaskHelpRequest()
            help.taskId = t.taskId
            #expect(try await w.tasks.requestTeamTaskHelp(help, options: alice.options).notifiedCount == 1)
            try await Task.sleep(for: .milliseconds(300))
            // Not delivered (social refuses every call, the test's reads too): it waits in tasks' outbox.
            #expect(try await !w.core.database.pendingOutbox(limit: 10).isEmpty)
            w.setSocialDown(false)
            #expect(try await w.outboxDrained())
            #expect(try await w.notifications(to: bob, kind: .helpRequest).count == 1)
        }
    }
}
