import Contracts
import Foundation
import RPCCore
import Security
import ServiceKit
import ServiceKitTesting
import Testing

@testable import Tasks

/// What a hostile or broken client sends: garbage bytes, requests over a method's limit, forged
/// page tokens, the same write many times at once. Each gets a clear status, nothing half-written,
/// and the service keeps serving.
@Suite("Tasks: hostile clients")
struct HostileClientTests {
    @Test func garbageAndOversizedRequestsAreRefusedAndTheServiceKeepsServing() async throws {
        try await withWorld { w in
            let alice = try await w.user("alice")
            let client = w.channel.client
            // Not a protobuf message at all.
            for garbage: [UInt8] in [[0xFF, 0xFF, 0xFF, 0xFF, 0x0F], [0x12, 0x80], Array(repeating: 0x0A, count: 9)] {
                await expectFailure(.invalidArgument) {
                    try await client.unary(
                        Tasks_V1_TasksMethods.createTeamTask, RawMessage(bytes: garbage), as: RawMessage.self, options: alice.options)
                }
            }
            // Over the method's 64 KiB limit: refused from the length prefix, naming the limit.
            var huge = createTask(with: [])
            huge.description_p = String(repeating: "x", count: 100_000)
            let f = await expectFailure(.resourceExhausted) { try await w.tasks.createTeamTask(huge, options: alice.options) }
            #expect(f?.message.contains("65536") == true)
            // Over the field's limit but within the message's: named.
            huge.description_p = String(repeating: "x", count: 2001)
            await expectFailure(.invalidArgument, fields: ["description"]) { try await w.tasks.createTeamTask(huge, options: alice.options) }
            // An upload far over the 5 MiB method limit (as a hostile client would send it).
            var up = Tasks_V1_UploadTeamTaskAttachmentRequest()
            up.uploadToken = "AAAA-AAAAA"
            up.filename = "x.bin"
            up.data = [UInt8](repeating: 7, count: 5 * 1024 * 1024 + 64 * 1024)
            await expectFailure(.resourceExhausted) { try await w.tasks.uploadTeamTaskAttachment(up) }
            // Still serving, nothing half-written.
            #expect(try await w.tasks.createTeamTask(createTask(with: []), options: alice.options).task.participantCount == 1)
            #expect(try await w.tasks.listMyTeamTasks(Tasks_V1_ListMyTeamTasksRequest(), options: alice.options).tasks.count == 1)
        }
    }

    @Test func manyIdenticalWritesAtOnceCreateOne() async throws {
        try await withWorld { w in
            let (alice, bob) = (try await w.user("alice"), try await w.user("bob"))
            let hh = try await w.household([alice, bob])
            let chore = createChore(household: hh, due: date(2030, 1, 1), assignees: [alice.id, bob.id], key: "same-chore")
            let comment = createTask(with: [bob.username], key: "same-task")
            let ids = try await withThrowingTaskGroup(of: (String, String).self) { group in
                for _ in 0..<16 {
                    group.addTask {
                        (
                            try await w.tasks.createChore(chore, options: alice.options).chore.choreId,
                            try await w.tasks.createTeamTask(comment, options: alice.options).task.taskId
                        )
                    }
                }
                var out: [(String, String)] = []
                for try await x in group { out.append(x) }
                return out
            }
            #expect(Set(ids.map(\.0)).count == 1 && Set(ids.map(\.1)).count == 1)
            var list = Tasks_V1_ListChoresRequest()
            list.householdId = hh
            #expect(try await w.tasks.listChores(list, options: bob.options).chores.count == 1)
            #expect(try await w.tasks.listMyTeamTasks(Tasks_V1_ListMyTeamTasksRequest(), options: bob.options).tasks.count == 1)
            #expect(try await w.outboxDrained())
            // One TASK_ASSIGNED for the task, none twice.
            #expect(try await w.notifications(to: bob, kind: .taskAssigned).filter { $0.target.taskId == ids[0].1 }.count == 1)
        }
    }

    @Test func forgedAndForeignPageTokensAndIdsAreRefused() async throws {
        try await withWorld { w in
            let (alice, bob) = (try await w.user("alice"), try await w.user("bob"))
            for _ in 0..<3 { _ = try await w.tasks.createTeamTask(createTask(with: [bob.username]), options: alice.options) }
            var list = Tasks_V1_ListMyTeamTasksRequest()
            list.pageSize = 1
            let token = try await w.tasks.listMyTeamTasks(list, options: alice.options).nextPageToken
            // bob cannot use alice's page token (bound to the caller).
            list.pageToken = token
            await expectFailure(.invalidArgument, fields: ["page_token"]) { try await w.tasks.listMyTeamTasks(list, options: bob.options) }
            list.pageToken = String(token.reversed())
            await expectFailure(.invalidArgument, fields: ["page_token"]) { try await w.tasks.listMyTeamTasks(list, options: alice.options) }
            var get = Tasks_V1_GetTeamTaskRequest()
            get.taskId = String(repeating: "x", count: 65)
            await expectFailure(.invalidArgument, fields: ["task_id"]) { try await w.tasks.getTeamTask(get, options: alice.options) }
            get.taskId = "' OR 1=1 --"
            await expectFailure(.notFound) { try await w.tasks.getTeamTask(get, options: alice.options) }
            // An internal method without the service credential: refused.
            await expectFailure(.permissionDenied) {
                try await Tasks_V1_TasksInternalClient(w.channel.client).verifyJournal(Tasks_V1_VerifyJournalRequest())
            }
        }
    }
}
