import Accounts
import ContractTesting
import Contracts
import Foundation
import RPCCore
import Testing

/// Runs every fixture of `Tests/Fixtures/accounts/` against a live service with the shared
/// `ContractHarness`: the request fixture is encoded by protoc and sent over gRPC (by the right
/// caller, in a scenario that gives the fixture's state, fixture ids and tokens mapped to live
/// ones), and the response is compared with the response fixture, ignoring its `# generated:`
/// fields.
@Suite("Accounts: contract fixtures against the live service")
struct ContractFixtureTests {
    static let fixtures = ContractPaths.locate().root + "/Tests/Fixtures/accounts"

    @Test func everyFixtureMatchesTheLiveService() async throws {
        try await withAccounts { env in
            let runner = FixtureRunner(env: env)
            let a = env.accounts, i = env.internalAPI
            let aliceFixtureID = "01JD3K7Q2M8W5X9Y4Z6A1B2C3D", bobFixtureID = "01JD3K8R4N9X6Y1Z5A7B2C3D4E"

            // alice: signs up, uploads the 70-byte PNG, reads herself, logs in, refreshes.
            let alice = try await runner.run("SignUp", Accounts_V1_SignUpRequest.self) { try await a.signUp($0) }
            let s1 = alice.session
            _ = try await runner.run("UploadAvatar", Accounts_V1_UploadAvatarRequest.self) { try await a.uploadAvatar($0, options: bearer(s1)) }
            _ = try await runner.run("GetMyProfile", Accounts_V1_GetMyProfileRequest.self) { try await a.getMyProfile($0, options: bearer(s1)) }
            let s2 = try await runner.run("LogIn", Accounts_V1_LogInRequest.self) { try await a.logIn($0) }.session
            _ = try await runner.run("RefreshSession", Accounts_V1_RefreshSessionRequest.self, rewrite: { $0.refreshToken = s2.refreshToken }) {
                try await a.refreshSession($0)
            }

            // bob_k (a built-in avatar), carol.w, cassie, cathy (a third "ca" for a next page), dave, a guest.
            var bobContact = Accounts_V1_ContactInfo()
            bobContact.phoneNumber = "+48 22 555 01 77"
            let bob = try await env.signUp("bob_k", email: "bob.kowalski@example.com", displayName: "Bob Kowalski", contact: bobContact)
            _ = try await runner.run("ChooseAvatar", Accounts_V1_ChooseAvatarRequest.self) {
                try await a.chooseAvatar($0, options: bearer(bob.session))
            }
            let carol = try await env.signUp("carol.w", displayName: "Carol Wong").session
            var choose = Accounts_V1_ChooseAvatarRequest()
            choose.builtinAvatarId = "blue-owl"
            _ = try await a.chooseAvatar(choose, options: bearer(carol))
            var cassieContact = Accounts_V1_ContactInfo()
            cassieContact.publicEmail = "cassie.d@example.net"
            try await env.signUp("cassie", displayName: "Cassie Dube", contact: cassieContact)
            try await env.signUp("cathy")
            try await env.signUp("dave", email: "dave.okafor@example.com", displayName: "Dave Okafor")
            _ = try await a.createGuest(Accounts_V1_CreateGuestRequest())

            let ids = { (r: inout [String]) in r = r.map { $0 == aliceFixtureID ? alice.user.userId : $0 == bobFixtureID ? bob.user.userId : $0 } }
            _ = try await runner.run("GetAvatar", Accounts_V1_GetAvatarRequest.self, rewrite: { $0.userId = alice.user.userId }) {
                try await a.getAvatar($0, options: bearer(carol))
            }
            _ = try await runner.run("GetProfile", Accounts_V1_GetProfileRequest.self) { try await a.getProfile($0, options: bearer(carol)) }
            _ = try await runner.run("SearchUsers", Accounts_V1_SearchUsersRequest.self) { try await a.searchUsers($0, options: bearer(carol)) }
            _ = try await runner.run("ListBuiltinAvatars", Accounts_V1_ListBuiltinAvatarsRequest.self) {
                try await a.listBuiltinAvatars($0, options: bearer(carol))
            }
            _ = try await runner.run("GetUsersByIds", Accounts_V1_GetUsersByIdsRequest.self, rewrite: { ids(&$0.userIds) }) {
                try await i.getUsersByIds($0)
            }
            _ = try await runner.run("ResolveUsernames", Accounts_V1_ResolveUsernamesRequest.self) { try await i.resolveUsernames($0) }
            _ = try await runner.run("ResolveEmails", Accounts_V1_ResolveEmailsRequest.self) { try await i.resolveEmails($0) }
            // The first id is carol's live session; the second never existed (ended).
            _ = try await runner.run(
                "CheckSessions", Accounts_V1_CheckSessionsRequest.self,
                rewrite: { $0.sessionIds = $0.sessionIds.map { $0 == "01JD3KS1QW7E8R9T0Y1U2I3O4P" ? carol.sessionId : $0 } }
            ) { try await i.checkSessions($0) }
            _ = try await runner.run("UpdateProfile", Accounts_V1_UpdateProfileRequest.self) { try await a.updateProfile($0, options: bearer(s1)) }

            // Guest → full account.
            let guest = try await runner.run("CreateGuest", Accounts_V1_CreateGuestRequest.self) { try await a.createGuest($0) }
            _ = try await runner.run("UpgradeGuest", Accounts_V1_UpgradeGuestRequest.self) {
                try await a.upgradeGuest($0, options: bearer(guest.session))
            }

            // Passwords: alice has s1, s2 and one more session → ChangePassword revokes 2.
            _ = try await env.logIn("alice")
            _ = try await runner.run("ChangePassword", Accounts_V1_ChangePasswordRequest.self) { try await a.changePassword($0, options: bearer(s1)) }
            _ = try await runner.run("RequestPasswordReset", Accounts_V1_RequestPasswordResetRequest.self) { try await a.requestPasswordReset($0) }
            #expect(try await env.waitForMail(to: "alice.martin@example.com").count == 1)
            let listed = try await runner.run("ListSentMail", Accounts_V1_ListSentMailRequest.self) { try await i.listSentMail($0) }
            let token = try #require(listed.mails.first?.data["reset_token"])
            for _ in 0..<3 { _ = try await env.logIn("alice", "lantern-quartz-meadow-7") }  // with s1: 4 sessions
            _ = try await runner.run("ResetPassword", Accounts_V1_ResetPasswordRequest.self, rewrite: { $0.resetToken = token }) {
                try await a.resetPassword($0)
            }
            var last = try await env.logIn("alice", "new-harbour-lights-19").session
            for _ in 0..<2 { last = try await env.logIn("alice", "new-harbour-lights-19").session }
            _ = try await runner.run("LogOut", Accounts_V1_LogOutRequest.self) { [last] in try await a.logOut($0, options: bearer(last)) }

            // Mail from social, the token keys after one rotation, and a deletion.
            _ = try await runner.run("SendMail", Accounts_V1_SendMailRequest.self) { try await i.sendMail($0) }
            try env.core.keys.rotate()
            _ = try await runner.run("GetSigningKeys", Accounts_V1_GetSigningKeysRequest.self) { try await a.getSigningKeys($0) }
            let erin = try await env.signUp("erin").session
            _ = try await runner.run("DeleteAccount", Accounts_V1_DeleteAccountRequest.self) { try await a.deleteAccount($0, options: bearer(erin)) }

            // Every fixture pair of the directory was exercised.
            let names = try FileManager.default.contentsOfDirectory(atPath: Self.fixtures).filter { $0.hasSuffix(".request.txtpb") }
                .map { String($0.dropLast(".request.txtpb".count)) }
            #expect(Set(names) == runner.ran, "fixtures not run: \(Set(names).subtracting(runner.ran).sorted())")
            #expect(Set(names).count == Accounts_V1_AccountsMethods.all.count + Accounts_V1_AccountsInternalMethods.all.count)
        }
    }
}

final class FixtureRunner: @unchecked Sendable {
    let env: TestAccounts
    let harness: ContractHarness
    private(set) var ran = Set<String>()

    init(env: TestAccounts) {
        self.env = env
        harness = ContractHarness(transport: env.channel)
    }

    /// Sends the fixture request (after `rewrite` maps fixture ids and tokens to live ones) with
    /// `call`, checks the response against the fixture, and returns it for the next steps.
    func run<Req: ProtoMessage, Res: ProtoMessage>(
        _ method: String, _: Req.Type, rewrite: (inout Req) -> Void = { _ in },
        sourceLocation: SourceLocation = #_sourceLocation,
        _ call: (Req) async throws -> Res
    ) async throws -> Res {
        ran.insert(method)
        let requestFixture = try ContractFixture.load(service: "accounts", fileName: "\(method).request.txtpb", paths: harness.paths)
        let responseFixture = try ContractFixture.load(service: "accounts", fileName: "\(method).response.txtpb", paths: harness.paths)
        #expect(requestFixture.messageName == Req.protoMessageName, sourceLocation: sourceLocation)
        let files = try harness.paths.protoFiles(service: "accounts")
        var request = try Req(serializedBytes: try await harness.protoc.encode(requestFixture.messageName, text: requestFixture.text, files: files))
        rewrite(&request)
        let response: Res
        do { response = try await call(request) } catch {
            Issue.record("\(method): the live service failed: \(error)", sourceLocation: sourceLocation)
            throw error
        }
        let result = try await harness.compare(response.serializedBytes(), with: responseFixture, method: method)
        #expect(result.matches, "\(result)", sourceLocation: sourceLocation)
        return response
    }
}
