import GRPCContracts
import RPCCore
import Synchronization

/// `grpc.health.v1.Health`: Check and Watch over a table of service statuses. The empty name is
/// the server as a whole. Services flip their status with `setStatus` (e.g. NOT_SERVING while
/// a dependency is down, or during shutdown); watchers hear every change.
public final class HealthService: Grpc_Health_V1_HealthService, Sendable {
    public typealias Status = Grpc_Health_V1_HealthCheckResponse.ServingStatus

    private struct State {
        var statuses: [String: Status]
        var watchers: [Int: (service: String, continuation: AsyncStream<Status>.Continuation)] = [:]
        var nextID = 0
    }
    private let state: Mutex<State>

    /// Every named service (and the server, "") starts SERVING.
    public init(services: [String]) {
        var statuses: [String: Status] = ["": .serving]
        for s in services { statuses[s] = .serving }
        state = Mutex(State(statuses: statuses))
    }

    public func setStatus(_ status: Status, for service: String = "") {
        let targets = state.withLock { s -> [AsyncStream<Status>.Continuation] in
            guard s.statuses[service] != status else { return [] }
            s.statuses[service] = status
            return s.watchers.values.filter { $0.service == service }.map(\.continuation)
        }
        for t in targets { t.yield(status) }
    }

    /// Marks every service NOT_SERVING (graceful shutdown: load balancers stop sending).
    public func markAllNotServing() {
        let names = state.withLock { Array($0.statuses.keys) }
        for n in names { setStatus(.notServing, for: n) }
    }

    public func status(of service: String) -> Status? { state.withLock { $0.statuses[service] } }

    public func check(request: Grpc_Health_V1_HealthCheckRequest, context: ServerContext) async throws -> Grpc_Health_V1_HealthCheckResponse {
        guard let status = status(of: request.service) else {
            throw RPCError(.notFound, "unknown service '\(request.service)'")
        }
        var response = Grpc_Health_V1_HealthCheckResponse()
        response.status = status
        return response
    }

    public func watch(
        request: Grpc_Health_V1_HealthCheckRequest, responses: ResponseWriter<Grpc_Health_V1_HealthCheckResponse>,
        context: ServerContext
    ) async throws {
        let (stream, continuation) = AsyncStream<Status>.makeStream(bufferingPolicy: .bufferingNewest(1))
        let (id, current) = state.withLock { s -> (Int, Status) in
            let id = s.nextID
            s.nextID += 1
            s.watchers[id] = (request.service, continuation)
            return (id, s.statuses[request.service] ?? .serviceUnknown)
        }
        defer { _ = state.withLock { $0.watchers.removeValue(forKey: id) }; continuation.finish() }
        var response = Grpc_Health_V1_HealthCheckResponse()
        response.status = current
        try await responses.write(response)
        var last = current
        for await status in stream where status != last {
            last = status
            response.status = status
            try await responses.write(response)
        }
    }
}
