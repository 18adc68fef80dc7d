import Accounts
import ArgumentParser
import Contracts
import Logging
import RPCTransport
import ServiceKit

/// `accounts-service [run] [--host H] [--port 9101] [--data-dir ./data/accounts]`: identity, sessions,
/// profiles (accounts.v1.Accounts and accounts.v1.AccountsInternal), with health and reflection.
/// Configuration beyond the shared flags comes from environment variables (Sources/Accounts/README.md).
///
/// `accounts-service backup --data-dir DIR --to FILE` copies its database while it runs, and
/// `accounts-service restore --data-dir DIR --from FILE` puts a backup back while it is stopped
/// (ServiceKit's `BackupCommand`/`RestoreCommand`; docs/operations.md, "Backups").
@main
struct AccountsServiceCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "accounts-service",
        abstract: "The accounts service: sign-up, log-in, sessions, profiles, avatars (gRPC).",
        subcommands: [Run.self, BackupCommand<AccountsSchema>.self, RestoreCommand<AccountsSchema>.self], defaultSubcommand: Run.self)
}

extension AccountsServiceCommand {
    /// Serving: the default subcommand, so `accounts-service --port N` works as it always did.
    struct Run: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "run", abstract: "Serve (the default).")

        @OptionGroup var options: ServiceOptions
        @Flag(
            name: .customLong("rotate-signing-key"),
            help: "Replace the token signing key at startup (the old one keeps verifying until its tokens expire).")
        var rotateSigningKey = false

        func run() async throws {
            let settings = try ServiceSettings(name: "accounts", options: options)
            ServiceHost.bootstrapLogging(settings)
            let logger = Logger(label: "accounts")
            let configuration = try AccountsConfiguration.from(settings.settings, dataDirectory: settings.dataDir)
            let core = try AccountsCore(configuration: configuration, logger: logger)
            defer { core.close() }
            if rotateSigningKey { try core.keys.rotate() }
            logger.info("password hashing: \(configuration.passwordParameters); mail: \(configuration.mail)")
            let peers = PeerClients(settings: settings)
            try await ServiceHost.run(
                settings: settings, services: core.services, descriptors: ContractsDescriptors.descriptorSet,
                keys: core.signingKeySource, logger: logger, background: core.backgroundJobs,
                outbox: .init(database: core.database, senders: core.outboxSenders(peers: peers)), peers: peers
            ) { server in
                server.maxReceiveMessageSize = configuration.maxRequestBytes
            }
        }
    }
}
