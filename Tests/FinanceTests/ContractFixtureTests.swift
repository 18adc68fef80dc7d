import ContractTesting
import Contracts
import Foundation
import RPCCore
import ServiceKitTesting
import Testing

/// Runs every fixture of `Tests/Fixtures/finance/` against the live service with the shared
/// `ContractHarness`: the request fixture is encoded by protoc and sent over gRPC (fixture user
/// ids mapped to live accounts users with the fixture's names, the fixture's household at the
/// social peer), and the answer is compared with the response fixture, ignoring `# generated:`.
@Suite("Finance: contract fixtures against the live service")
struct ContractFixtureTests {
    static let fixtures = ContractPaths.locate().root + "/Tests/Fixtures/finance"

    @Test func everyFixtureMatchesTheLiveService() async throws {
        try await withFinance { env in
            // The fixtures' people, signed up in id order (alice < bob < carol < dave, as in the fixtures).
            let alice = try await env.user("alice", displayName: "Alice Martin")
            let bob = try await env.user("bob_k", displayName: "Bob Kowalski")
            let carol = try await env.user("carol.w", displayName: "Carol Wong")
            let dave = try await env.user("dave", displayName: "Dave Okafor")
            let live = [
                "01JD3K7Q2M8W5X9Y4Z6A1B2C3D": alice.id, "01JD3K8R4N9X6Y1Z5A7B2C3D4E": bob.id,
                "01JD3K9S5P1Y7Z2A6B8C3D4E5F": carol.id, "01JD3KAT6Q2Z8A3B7C9D4E5F6G": dave.id,
            ]
            let map = { (id: String) in live[id] ?? id }
            // The fixtures' household is a real one made in social; requests get its live id (the
            // responses' household_id is generated: not compared).
            let household = try await env.household([alice, bob, carol, dave])
            let runner = FixtureRunner(env: env, households: ["01JD4H2M3N4P5Q6R7S8T9V0W1X": household])
            let f = env.finance, i = env.internalAPI

            _ = try await runner.run(
                "CreatePayment", Finance_V1_CreatePaymentRequest.self, rewrite: { $0.housemateUserIds = $0.housemateUserIds.map(map) }
            ) {
                try await f.createPayment($0, options: alice.options)
            }
            try await env.leave(household, dave)  // dave moves out
            _ = try await runner.run(
                "CreateCharge", Finance_V1_CreateChargeRequest.self,
                rewrite: { r in
                    r.customShares = r.customShares.map {
                        var s = $0; s.userId = map(s.userId); return s
                    }
                }
            ) { try await f.createCharge($0, options: alice.options) }
            _ = try await runner.run("GetBalances", Finance_V1_GetBalancesRequest.self) { try await f.getBalances($0, options: alice.options) }
            _ = try await runner.run(
                "ListTransactions", Finance_V1_ListTransactionsRequest.self, rewrite: { $0.counterpartUserId = map($0.counterpartUserId) }
            ) {
                try await f.listTransactions($0, options: alice.options)
            }
            _ = try await runner.run("GetSettleUpPlan", Finance_V1_GetSettleUpPlanRequest.self) {
                try await f.getSettleUpPlan($0, options: alice.options)
            }
            _ = try await runner.run("RecordRepayment", Finance_V1_RecordRepaymentRequest.self, rewrite: { $0.payeeUserId = map($0.payeeUserId) }) {
                try await f.recordRepayment($0, options: alice.options)
            }
            _ = try await runner.run("VerifyLedger", Finance_V1_VerifyLedgerRequest.self) { try await i.verifyLedger($0) }
            _ = try await runner.run("RecordTaskSettlement", Finance_V1_RecordTaskSettlementRequest.self) { try await i.recordTaskSettlement($0) }
            _ = try await runner.run("EraseUser", Finance_V1_EraseUserRequest.self) { try await i.eraseUser($0) }

            let names = try FileManager.default.contentsOfDirectory(atPath: Self.fixtures).filter { $0.hasSuffix(".request.txtpb") }
                .map { String($0.dropLast(".request.txtpb".count)) }
            #expect(Set(names) == runner.ran, "fixtures not run: \(Set(names).subtracting(runner.ran).sorted())")
            #expect(Set(names).count == Finance_V1_FinanceMethods.all.count + Finance_V1_FinanceInternalMethods.all.count)
        }
    }
}

final class FixtureRunner: @unchecked Sendable {
    let harness: ContractHarness
    /// Fixture household id → live household id (requests with a `household_id` are rewritten).
    let households: [String: String]
    private(set) var ran = Set<String>()

    init(env: FinanceEnv, households: [String: String] = [:]) {
        harness = ContractHarness(transport: env.server.channel)
        self.households = households
    }

    /// Sends the fixture request (after `rewrite` maps fixture ids to live ones) with `call`, and
    /// checks the response against the fixture.
    func run<Req: ProtoMessage, Res: ProtoMessage>(
        _ method: String, _: Req.Type, rewrite: (inout Req) -> Void = { _ in },
        sourceLocation: SourceLocation = #_sourceLocation, _ call: (Req) async throws -> Res
    ) async throws -> Res {
        ran.insert(method)
        let requestFixture = try ContractFixture.load(service: "finance", fileName: "\(method).request.txtpb", paths: harness.paths)
        let responseFixture = try ContractFixture.load(service: "finance", fileName: "\(method).response.txtpb", paths: harness.paths)
        #expect(requestFixture.messageName == Req.protoMessageName, sourceLocation: sourceLocation)
        let files = try harness.paths.protoFiles(service: "finance")
        var request = try Req(serializedBytes: try await harness.protoc.encode(requestFixture.messageName, text: requestFixture.text, files: files))
        if var withHousehold = request as? any HouseholdScoped, let live = households[withHousehold.householdId] {
            withHousehold.householdId = live
            request = withHousehold as! Req
        }
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

/// Requests that name a household (their fixture's id is rewritten to the live one).
protocol HouseholdScoped {
    var householdId: String { get set }
}
extension Finance_V1_CreatePaymentRequest: HouseholdScoped {}
extension Finance_V1_CreateChargeRequest: HouseholdScoped {}
extension Finance_V1_GetBalancesRequest: HouseholdScoped {}
extension Finance_V1_ListTransactionsRequest: HouseholdScoped {}
extension Finance_V1_GetSettleUpPlanRequest: HouseholdScoped {}
extension Finance_V1_RecordRepaymentRequest: HouseholdScoped {}
extension Finance_V1_VerifyLedgerRequest: HouseholdScoped {}
