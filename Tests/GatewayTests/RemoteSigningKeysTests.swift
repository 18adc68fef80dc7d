import Contracts
import RPCCore
import RPCTransport
import ServiceKit
import Testing

@Suite struct RemoteSigningKeysTests {
    /// While accounts is away, calls inside the minimum refresh interval fail without a fetch,
    /// and say why the last fetch failed rather than only that one was tried a moment ago.
    @Test func failuresInsideTheRefreshIntervalNameTheLastCause() async throws {
        // Nothing listens on port 1: every fetch is refused at once.
        let channel = RPCChannel(configuration: ChannelConfiguration(host: "127.0.0.1", port: 1))
        let keys = RemoteSigningKeys(client: channel.client, minRefreshInterval: .seconds(60))
        var messages: [String] = []
        for _ in 0..<2 {
            do {
                _ = try await keys.keys()
                Issue.record("keys() succeeded with nothing listening")
            } catch let error as RPCError {
                #expect(error.code == .unavailable)
                messages.append(error.message)
            }
        }
        await channel.close()
        try #require(messages.count == 2)
        let prefix = "cannot fetch token keys from accounts: "
        #expect(messages[0].hasPrefix(prefix), "\(messages[0])")
        #expect(messages[1].contains("tried less than"), "\(messages[1])")
        let cause = String(messages[0].dropFirst(prefix.count))
        #expect(!cause.isEmpty && messages[1].contains(cause), "\(messages)")
    }

    /// The burst of calls that arrives before the first keys are in (a gateway just started)
    /// waits for the one fetch under way instead of failing, and accounts sees one fetch.
    @Test func concurrentCallersShareOneFetch() async throws {
        let keys = TestKeys()
        let recorder = Recorder()
        let accounts = try await FakeUpstream(
            services: [Fake.Accounts(keys: KeyStore([(keys.keyID, keys.pair.publicKey)]), recorder: recorder)],
            keys: KeyStore([]))
        let channel = RPCChannel(configuration: ChannelConfiguration(host: "127.0.0.1", port: accounts.port))
        let source = RemoteSigningKeys(client: channel.client, minRefreshInterval: .seconds(60))
        let results = await withTaskGroup(of: Result<[String], any Error>.self) { group in
            for i in 0..<20 {
                group.addTask {
                    if i % 2 == 0 { await source.refresh() }
                    do { return .success(Array(try await source.keys().keys)) } catch { return .failure(error) }
                }
            }
            return await group.reduce(into: []) { $0.append($1) }
        }
        await channel.close()
        await accounts.stop()
        for r in results {
            switch r {
            case .success(let ids): #expect(ids == [keys.keyID])
            case .failure(let error): Issue.record("keys() failed: \(error)")
            }
        }
        #expect(recorder.count(Accounts_V1_AccountsMethods.getSigningKeys.path) == 1)
    }
}
