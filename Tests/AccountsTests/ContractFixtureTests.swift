import Accounts
import Contracts
import Foundation
import RPCCore
import Testing

/// Runs every fixture of `Tests/Fixtures/accounts/` against a live service: the request file is
/// encoded by protoc and sent over gRPC (by the right caller, in a scenario that gives the
/// fixture's state), and the response is compared with the response file through protoc's
/// canonical text, ignoring the fields its `# generated:` line lists.
@Suite("Accounts: contract fixtures against the live service")
struct ContractFixtureTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path
    static let fixtures = "\(root)/Tests/Fixtures/accounts"

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
            _ = try await runner.run("ChooseAvatar", Accounts_V1_ChooseAvatarRequest.self) { try await a.chooseAvatar($0, options: bearer(bob.session)) }
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
            _ = try await runner.run("ListBuiltinAvatars", Accounts_V1_ListBuiltinAvatarsRequest.self) { try await a.listBuiltinAvatars($0, options: bearer(carol)) }
            _ = try await runner.run("GetUsersByIds", Accounts_V1_GetUsersByIdsRequest.self, rewrite: { ids(&$0.userIds) }) { try await i.getUsersByIds($0) }
            _ = try await runner.run("ResolveUsernames", Accounts_V1_ResolveUsernamesRequest.self) { try await i.resolveUsernames($0) }
            _ = try await runner.run("ResolveEmails", Accounts_V1_ResolveEmailsRequest.self) { try await i.resolveEmails($0) }
            _ = try await runner.run("UpdateProfile", Accounts_V1_UpdateProfileRequest.self) { try await a.updateProfile($0, options: bearer(s1)) }

            // Guest → full account.
            let guest = try await runner.run("CreateGuest", Accounts_V1_CreateGuestRequest.self) { try await a.createGuest($0) }
            _ = try await runner.run("UpgradeGuest", Accounts_V1_UpgradeGuestRequest.self) { try await a.upgradeGuest($0, options: bearer(guest.session)) }

            // Passwords: alice has s1, s2 and one more session → ChangePassword revokes 2.
            _ = try await env.logIn("alice")
            _ = try await runner.run("ChangePassword", Accounts_V1_ChangePasswordRequest.self) { try await a.changePassword($0, options: bearer(s1)) }
            _ = try await runner.run("RequestPasswordReset", Accounts_V1_RequestPasswordResetRequest.self) { try await a.requestPasswordReset($0) }
            #expect(try await env.waitForMail(to: "alice.martin@example.com").count == 1)
            let listed = try await runner.run("ListSentMail", Accounts_V1_ListSentMailRequest.self) { try await i.listSentMail($0) }
            let token = try #require(listed.mails.first?.data["reset_token"])
            for _ in 0..<3 { _ = try await env.logIn("alice", "lantern-quartz-meadow-7") }  // with s1: 4 sessions
            _ = try await runner.run("ResetPassword", Accounts_V1_ResetPasswordRequest.self, rewrite: { $0.resetToken = token }) { try await a.resetPassword($0) }
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
    private(set) var ran = Set<String>()
    init(env: TestAccounts) { self.env = env }

    /// Sends the fixture request (after `rewrite` maps fixture ids and tokens to live ones) with
    /// `call`, checks the response against the fixture, and returns it.
    func run<Req: ProtoMessage, Res: ProtoMessage>(
        _ method: String, _: Req.Type, rewrite: (inout Req) -> Void = { _ in },
        sourceLocation: SourceLocation = #_sourceLocation,
        _ call: (Req) async throws -> Res
    ) async throws -> Res {
        ran.insert(method)
        let requestFile = try Fixture(path: "\(ContractFixtureTests.fixtures)/\(method).request.txtpb")
        let responseFile = try Fixture(path: "\(ContractFixtureTests.fixtures)/\(method).response.txtpb")
        #expect(requestFile.messageName == Req.protoMessageName, sourceLocation: sourceLocation)
        #expect(responseFile.messageName == Res.protoMessageName, sourceLocation: sourceLocation)
        var request = try Req(serializedBytes: try Protoc.encode(requestFile.messageName, requestFile.text))
        rewrite(&request)
        let response: Res
        do { response = try await call(request) } catch {
            Issue.record("\(method): the live service failed: \(error)", sourceLocation: sourceLocation)
            throw error
        }
        let expected = try TextTree.parse(try Protoc.decode(responseFile.messageName, try Protoc.encode(responseFile.messageName, responseFile.text)))
        let actual = try TextTree.parse(try Protoc.decode(Res.protoMessageName, response.serializedBytes()))
        let e = expected.removing(responseFile.generated).rendered
        let a = actual.removing(responseFile.generated).rendered
        #expect(e == a, "\(method): live response differs from the fixture\n--- fixture\n\(e)\n--- live\n\(a)", sourceLocation: sourceLocation)
        return response
    }
}

/// One fixture file: its message name, its `# generated:` paths, its text.
struct Fixture {
    var messageName = ""
    var generated: [String] = []
    var text = ""

    init(path: String) throws {
        text = try String(contentsOfFile: path, encoding: .utf8)
        for line in text.split(separator: "\n") {
            if line.hasPrefix("# proto-message:") { messageName = line.dropFirst("# proto-message:".count).trimmingCharacters(in: .whitespaces) }
            if line.hasPrefix("# generated:") {
                generated = line.dropFirst("# generated:".count).split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
            }
        }
    }
}

enum Protoc {
    static func encode(_ message: String, _ text: String) throws -> [UInt8] { try run(["--encode=\(message)"], Array(text.utf8)) }
    static func decode(_ message: String, _ bytes: [UInt8]) throws -> String { String(decoding: try run(["--decode=\(message)"], bytes), as: UTF8.self) }

    static func run(_ arguments: [String], _ input: [UInt8]) throws -> [UInt8] {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/protoc")
        p.currentDirectoryURL = URL(fileURLWithPath: ContractFixtureTests.root)
        p.arguments = arguments + ["-IProto", "-I/usr/include", "Proto/accounts/v1/accounts.proto"]
        let stdin = Pipe(), stdout = Pipe(), stderr = Pipe()
        (p.standardInput, p.standardOutput, p.standardError) = (stdin, stdout, stderr)
        try p.run()
        // Feed and drain concurrently: a large message would fill a pipe.
        let writer = Thread { stdin.fileHandleForWriting.write(Data(input)); try? stdin.fileHandleForWriting.close() }
        writer.start()
        let out = stdout.fileHandleForReading.readDataToEndOfFile()
        let err = stderr.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        guard p.terminationStatus == 0 else { throw RPCError(.internal, "protoc \(arguments): \(String(decoding: err, as: UTF8.self))") }
        return [UInt8](out)
    }
}

/// protoc's canonical text format as a tree, to drop generated fields and compare.
indirect enum TextTree: Equatable {
    case scalar(String)
    case message([(String, TextTree)])

    static func == (a: TextTree, b: TextTree) -> Bool { a.rendered == b.rendered }

    /// Parses protoc `--decode` output: `name: value` and `name {` … `}` lines.
    static func parse(_ text: String) throws -> TextTree {
        var stack: [[(String, TextTree)]] = [[]]
        var names: [String] = []
        for raw in text.split(separator: "\n") {
            let line = raw.trimmingCharacters(in: .whitespaces)
            if line.isEmpty { continue }
            if line == "}" {
                guard stack.count > 1 else { throw RPCError(.internal, "unbalanced text format") }
                let fields = stack.removeLast()
                stack[stack.count - 1].append((names.removeLast(), .message(fields)))
            } else if line.hasSuffix(" {") {
                names.append(String(line.dropLast(2)))
                stack.append([])
            } else if let colon = line.firstIndex(of: ":") {
                stack[stack.count - 1].append((String(line[..<colon]), .scalar(line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces))))
            } else {
                throw RPCError(.internal, "unexpected text format line: \(line)")
            }
        }
        return .message(stack[0])
    }

    /// Without the fields at these dotted paths (through repeated fields and map entries).
    func removing(_ paths: [String]) -> TextTree {
        paths.reduce(self) { $0.removing(path: $1.split(separator: ".").map(String.init)[...]) }
    }

    private func removing(path: ArraySlice<String>) -> TextTree {
        guard case .message(let fields) = self, let head = path.first else { return self }
        if path.count == 1 { return .message(fields.filter { $0.0 != head }) }
        return .message(fields.map { $0.0 == head ? ($0.0, $0.1.removing(path: path.dropFirst())) : $0 })
    }

    /// Canonical text; map entries (only key/value fields) sorted, since maps have no order.
    var rendered: String { render(indent: "") }

    private func render(indent: String) -> String {
        switch self {
        case .scalar(let s): return s
        case .message(let fields):
            var lines: [String] = []
            var i = 0
            while i < fields.count {
                var j = i
                while j < fields.count && fields[j].0 == fields[i].0 { j += 1 }
                var group = fields[i..<j].map { "\(indent)\($0.0)" + ($0.1.isMessage ? " {\n\($0.1.render(indent: indent + "  "))\(indent)}" : ": \($0.1.render(indent: ""))") }
                if fields[i..<j].allSatisfy({ $0.1.isMapEntry }) { group.sort() }
                lines += group
                i = j
            }
            return lines.map { $0 + "\n" }.joined()
        }
    }

    var isMessage: Bool { if case .message = self { return true } else { return false } }
    var isMapEntry: Bool {
        guard case .message(let fields) = self else { return false }
        return !fields.isEmpty && fields.allSatisfy { $0.0 == "key" || $0.0 == "value" }
    }
}
