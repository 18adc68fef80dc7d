import ArgumentParser
import Contracts
import Finance
import Foundation
import Logging
import ServiceKit

/// `finance-service [run] [--host H] [--port 9103] [--data-dir ./data/finance]`: household money and
/// marketplace settlements (finance.v1.Finance and finance.v1.FinanceInternal), with health and
/// reflection. `--verify-ledgers` verifies every ledger's hash chain and balances and exits
/// (0 = all verify, 1 = one does not). Settings: Sources/Finance/README.md.
///
/// `finance-service backup --data-dir DIR --to FILE` copies its database while it runs, and
/// `finance-service restore --data-dir DIR --from FILE` puts a backup back while it is stopped
/// (ServiceKit's `BackupCommand`/`RestoreCommand`; docs/operations.md, "Backups").
@main
struct FinanceServiceCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "finance-service",
        abstract: "The finance service: payments, charges, balances, settlements (gRPC).",
        subcommands: [Run.self, BackupCommand<FinanceSchema>.self, RestoreCommand<FinanceSchema>.self], defaultSubcommand: Run.self)
}

extension FinanceServiceCommand {
    /// Serving: the default subcommand, so `finance-service --port N` works as it always did.
    struct Run: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "run", abstract: "Serve (the default).")

        @OptionGroup var options: ServiceOptions
        @Flag(name: .customLong("verify-ledgers"), help: "Verify every ledger (hash chains, balances) of the data directory and exit.")
        var verifyLedgers = false

        func run() async throws {
            let settings = try ServiceSettings(name: "finance", options: options)
            ServiceHost.bootstrapLogging(settings)
            let logger = Logger(label: "finance")
            let peers = PeerClients(settings: settings)
            let core = try FinanceCore(configuration: .from(settings.settings, dataDirectory: settings.dataDir), peers: peers, logger: logger)
            defer { core.close() }
            if verifyLedgers {
                let (ok, report) = try core.verifyAll()
                for line in report { print(line) }
                print(ok ? "all \(report.count) ledgers verify" : "a ledger does not verify")
                if !ok { throw ExitCode(1) }
                return
            }
            try await ServiceHost.run(
                settings: settings, services: core.services, descriptors: ContractsDescriptors.descriptorSet,
                keys: RemoteSigningKeys(client: peers.client("accounts"), logger: logger),
                logger: logger, background: core.backgroundJobs,
                outbox: .init(database: core.database), peers: peers)
        }
    }
}
