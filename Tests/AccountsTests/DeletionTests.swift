import Accounts
import Contracts
import Foundation
import Logging
import RPCCore
import RPCTransport
import ServiceKit
import Storage
import Synchronization
import Testing

/// A stand-in for tasks' `TasksInternal/EraseUser`: records what it receives.
final class FakeEraseReceiver: RPCService, Sendable {
    let serviceName = Tasks_V1_TasksInternalMethods.serviceName
    let received = Mutex<[Tasks_V1_EraseUserRequest]>([])
    var methods: [ServerMethod] {
        [
            ServerMethod(
                Tasks_V1_TasksInternalMethods.eraseUser,
                .unary(Tasks_V1_EraseUserRequest.self, Tasks_V1_EraseUserResponse.self) { request, context in
                    guard context.requestMetadata[AuthInterceptor.serviceTokenHeader] == testServiceToken else {
                        throw RPCError(.permissionDenied, "no service credential")
                    }
                    self.received.withLock { $0.append(request) }
                    return Tasks_V1_EraseUserResponse()
                })
        ]
    }
}

@Suite("Accounts: account deletion and the outbox")
struct DeletionTests {
    func delete(_ password: String) -> Accounts_V1_DeleteAccountRequest {
        var r = Accounts_V1_DeleteAccountRequest()
        r.password = password
        return r
    }

    @Test func deletionNeedsThePasswordAndRemovesTheUserEverywhere() async throws {
        try await withAccounts { env in
            let name = uniqueName("dana")
            let dana = try await env.signUp(name, displayName: "Dana")
            let second = try await env.logIn(name).session
            let viewer = try await env.signUp().session

            await expectFailure(.invalidArgument, fields: ["password"]) {
                try await env.accounts.deleteAccount(delete("not it"), options: bearer(dana.session))
            }
            await expectFailure(.invalidArgument, fields: ["password"]) {
                try await env.accounts.deleteAccount(delete(""), options: bearer(dana.session))
            }
            let deleted = try await env.accounts.deleteAccount(delete("correct horse battery staple"), options: bearer(dana.session))
            #expect(abs(deleted.deletedAt.seconds - Int64(Date().timeIntervalSince1970)) < 5)

            // No log-in, no session, no profile, no search hit, no lookups.
            await expectFailure(.unauthenticated) { try await env.logIn(name) }
            for s in [dana.session, second] {
                await expectFailure(.unauthenticated) { try await env.accounts.refreshSession(refresh(s.refreshToken)) }
                await expectFailure(.unauthenticated) { try await env.accounts.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: bearer(s)) }
            }
            var byName = Accounts_V1_GetProfileRequest()
            byName.username = name
            await expectFailure(.notFound) { try await env.accounts.getProfile(byName, options: bearer(viewer)) }
            var byID = Accounts_V1_GetProfileRequest()
            byID.userId = dana.user.userId
            await expectFailure(.notFound) { try await env.accounts.getProfile(byID, options: bearer(viewer)) }
            var search = Accounts_V1_SearchUsersRequest()
            search.usernamePrefix = name
            #expect(try await env.accounts.searchUsers(search, options: bearer(viewer)).users.isEmpty)
            var ids = Accounts_V1_GetUsersByIdsRequest()
            ids.userIds = [dana.user.userId]
            #expect(try await env.internalAPI.getUsersByIds(ids).unknownUserIds == [dana.user.userId])

            // One erase event per other service, in the outbox, waiting to be delivered.
            let pending = try await env.core.database.pendingOutbox()
            #expect(Set(pending.map(\.destination)) == ["social", "finance", "tasks", "matchmaking"])
            #expect(pending.count == 4)
            for event in pending {
                #expect(event.kind == "accounts.v1.UserDeleted")
                let payload = try Accounts_V1_UserDeleted(serializedBytes: event.payload)
                #expect(payload.userId == dana.user.userId)
                #expect(payload.deletedAt == deleted.deletedAt)
                #expect(event.eventID == "\(payload.eventId):\(event.destination)")
            }
            #expect(Set(try pending.map { try Accounts_V1_UserDeleted(serializedBytes: $0.payload).eventId }).count == 1)

            // Personal data is scrubbed; the name and email are free again.
            let row = try #require(
                try env.core.database.readSync { c in
                    try c.queryOne("SELECT username, email, password_hash, display_name, deleted_at FROM users WHERE id = ?", dana.user.userId)
                })
            #expect(row["username"] == .null && row["email"] == .null && row["password_hash"] == .null)
            #expect(row["display_name"] == .text("") && row["deleted_at"] != .null)
            let again = try await env.signUp(name, email: dana.user.email)
            #expect(again.user.userId != dana.user.userId)
        }
    }

    @Test func guestsDeleteWithoutAPassword() async throws {
        try await withAccounts { env in
            let guest = try await env.accounts.createGuest(Accounts_V1_CreateGuestRequest())
            await expectFailure(.invalidArgument, fields: ["password"]) {
                try await env.accounts.deleteAccount(delete("x"), options: bearer(guest.session))
            }
            _ = try await env.accounts.deleteAccount(delete(""), options: bearer(guest.session))
            #expect(try await env.core.database.pendingOutbox().count == 4)
        }
    }

    @Test func eraseEventsAreDeliveredToEachServiceAndWaitForTheAbsentOnes() async throws {
        try await withAccounts { env in
            // tasks is up (a fake); social, finance and matchmaking are down.
            let receiver = FakeEraseReceiver()
            var config = ServerConfiguration(host: "127.0.0.1", port: 0)
            config.threads = 1
            let tasks = RPCServer(configuration: config, services: [receiver])
            let tasksPort = try await tasks.start()
            let closedPort = try await Self.unusedPort()
            let deliverer = UserDeletionDeliverer(
                core: env.core, retry: OutboxRetryPolicy(initialDelay: .seconds(60)), pollInterval: .milliseconds(200)
            ) { destination in
                let channel = RPCChannel(host: "127.0.0.1", port: destination == "tasks" ? tasksPort : closedPort)
                return RPCClient(transport: CredentialedTransport(base: channel, serviceToken: testServiceToken))
            }
            let loop = Task { await deliverer.run() }

            let dana = try await env.signUp()
            _ = try await env.accounts.deleteAccount(delete("correct horse battery staple"), options: bearer(dana.session))
            let deadline = ContinuousClock.now + .seconds(10)
            while receiver.received.withLock({ $0.isEmpty }) && ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(20))
            }
            let got = receiver.received.withLock { $0 }
            #expect(got.count == 1)
            #expect(got.first?.userId == dana.user.userId)
            // The others wait, with their failure recorded for the operator.
            var pending: [OutboxEvent] = []
            while ContinuousClock.now < deadline {
                pending = try await env.core.database.pendingOutbox()
                if pending.count == 3 && pending.allSatisfy({ $0.attempts >= 1 }) { break }
                try await Task.sleep(for: .milliseconds(20))
            }
            #expect(Set(pending.map(\.destination)) == ["social", "finance", "matchmaking"])
            #expect(pending.allSatisfy { $0.attempts >= 1 && $0.lastError != nil && $0.nextAttemptAt > Date() })
            #expect(got.first?.eventId == (try? Accounts_V1_UserDeleted(serializedBytes: pending[0].payload).eventId))
            #expect(env.logs.all.contains { $0.contains("outbox delivery failed") })

            loop.cancel()
            _ = await loop.value
            await tasks.shutdownGracefully()
        }
    }

    static func unusedPort() async throws -> Int {
        let server = RPCServer(configuration: ServerConfiguration(host: "127.0.0.1", port: 0), services: [])
        let port = try await server.start()
        await server.shutdownGracefully()
        return port
    }
}
