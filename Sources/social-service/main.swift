import ArgumentParser
import Contracts
import Logging
import ServiceKit
import Social

/// `social-service [run] [--host H] [--port 9104] [--data-dir ./data/social]`: teams, households,
/// friends, blocks, follows and notifications (social.v1.Social and social.v1.SocialInternal), with
/// health and reflection. Configuration beyond the shared flags comes from environment variables
/// (Sources/Social/README.md); peers from `ACCOUNTS_ADDR` and `TASKS_ADDR`.
///
/// `social-service backup --data-dir DIR --to FILE` copies its database while it runs, and
/// `social-service restore --data-dir DIR --from FILE` puts a backup back while it is stopped
/// (ServiceKit's `BackupCommand`/`RestoreCommand`; docs/operations.md, "Backups").
@main
struct SocialServiceCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "social-service",
        abstract: "The social service: teams, households, friends, follows, notifications (gRPC).",
        subcommands: [Run.self, BackupCommand<SocialSchema>.self, RestoreCommand<SocialSchema>.self], defaultSubcommand: Run.self)
}

extension SocialServiceCommand {
    /// Serving: the default subcommand, so `social-service --port N` works as it always did.
    struct Run: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "run", abstract: "Serve (the default).")

        @OptionGroup var options: ServiceOptions

        func run() async throws {
            let settings = try ServiceSettings(name: "social", options: options)
            ServiceHost.bootstrapLogging(settings)
            let logger = Logger(label: "social")
            let peers = PeerClients(settings: settings)
            let core = try SocialCore(configuration: .from(settings.settings, dataDirectory: settings.dataDir), peers: peers, logger: logger)
            defer { core.close() }
            try await ServiceHost.run(
                settings: settings, services: core.services, descriptors: ContractsDescriptors.descriptorSet,
                keys: RemoteSigningKeys(client: peers.client("accounts"), logger: logger),
                logger: logger, background: core.backgroundJobs,
                outbox: .init(database: core.database), peers: peers,
                beforeDrain: { core.shutDownStreams() })
        }
    }
}
