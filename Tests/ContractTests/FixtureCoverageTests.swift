import ContractTesting
import Contracts
import RPCCore
import Testing

/// Every RPC has its fixtures, every fixture belongs to an RPC and says what it holds, and the
/// catalog of Swift types matches the generated method tables.
@Suite struct FixtureCoverageTests {
    static let paths = ContractPaths.locate()

    @Test func catalogCoversEveryGeneratedService() {
        let cataloged = Set(ContractCatalog.services.flatMap { $0.methods.map(\.service) })
        #expect(cataloged == Set(ContractsDescriptors.services), "services of the contracts without a ContractCatalog entry, or stale ones")
    }

    @Test(arguments: ContractCatalog.services.map(\.directory))
    func catalogMatchesMethodTables(_ directory: String) throws {
        let service = try #require(ContractCatalog.service(directory))
        #expect(
            Set(service.rpcs.map(\.descriptor.path)) == Set(service.methods.map(\.path)),
            "ContractCatalog+\(directory): add or remove lines to match the generated …Methods.all")
        #expect(service.rpcs.count == service.methods.count, "ContractCatalog+\(directory) lists a method twice")
        for rpc in service.rpcs {
            #expect(rpc.requestType.protoMessageName == rpc.descriptor.inputType, "\(rpc.descriptor): request type")
            #expect(rpc.responseType.protoMessageName == rpc.descriptor.outputType, "\(rpc.descriptor): response type")
        }
    }

    @Test(arguments: ContractCatalog.services.map(\.directory))
    func everyRPCHasRequestAndResponseFixtures(_ directory: String) throws {
        let service = try #require(ContractCatalog.service(directory))
        let fixtures = try ContractFixture.all(service: directory, paths: Self.paths)
        let byName = Dictionary(fixtures.map { ($0.fileName, $0) }, uniquingKeysWith: { a, _ in a })
        for method in service.methods {
            for (role, type) in [("request", method.inputType), ("response", method.outputType)] {
                let name = "\(method.method).\(role).txtpb"
                guard let fixture = byName[name] else {
                    Issue.record("\(method): no \(directory)/\(name)")
                    continue
                }
                #expect(fixture.messageName == type, "\(fixture): proto-message is \(fixture.messageName), \(method) uses \(type)")
            }
        }
        let methods = Set(service.methods.map(\.method))
        for fixture in fixtures where !methods.contains(fixture.method) {
            Issue.record("\(fixture): no RPC \(fixture.method) in \(directory)")
        }
    }

    @Test(arguments: ContractCatalog.services.map(\.directory))
    func generatedPathsNameFields(_ directory: String) throws {
        for fixture in try ContractFixture.all(service: directory, paths: Self.paths) {
            switch fixture.role {
            case .request:
                #expect(!fixture.hasGeneratedLine, "\(fixture): requests have no `# generated:` line")
            case .response:
                #expect(fixture.hasGeneratedLine, "\(fixture): response fixtures need a `# generated:` line (it may be empty)")
                for path in fixture.generatedPaths {
                    if let problem = ProtoSchema.contracts.checkPath(path, in: fixture.messageName) {
                        Issue.record("\(fixture): generated path `\(path)`: \(problem)")
                    }
                }
            }
        }
    }
}
