import Contracts
import Foundation
import RPCCore
import ServiceKit
import ServiceKitTesting
import Tasks
import Testing

/// Rows a single user can make the service store, bounded.
@Suite("Tasks: per-user bounds", .serialized)
struct LimitsTests {
    @Test func unexpiredUploadTokensPerUserAreBounded() async throws {
        try await withWorld({ c in c.maxLiveUploadTokensPerUser = 3 }) { w in
            let (alice, bob) = (try await w.user("alice"), try await w.user("bob"))
            let t = try await w.tasks.createTeamTask(createTask(with: [bob.username]), options: alice.options).task
            var mk = Tasks_V1_CreateTeamTaskUploadTokenRequest()
            mk.taskId = t.taskId
            for _ in 0..<3 { _ = try await w.tasks.createTeamTaskUploadToken(mk, options: alice.options) }
            let refused = await expectFailure(.resourceExhausted) { try await w.tasks.createTeamTaskUploadToken(mk, options: alice.options) }
            #expect(refused?.retryDelaySeconds != nil)
            // Another user's bound is their own; once alice's tokens expire she may make more.
            _ = try await w.tasks.createTeamTaskUploadToken(mk, options: bob.options)
            w.clock.advance(by: .seconds(24 * 3600 + 1))
            _ = try await w.tasks.createTeamTaskUploadToken(mk, options: alice.options)
        }
    }
}
