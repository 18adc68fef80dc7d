import Contracts
import Foundation
import RPCCore
import ServiceKitTesting
import Storage
import Testing

@testable import ServiceKit

/// `SQLReader.storedAnswer`: a retry answered before a handler's slow part (a peer call).
@Suite struct IdempotencyLookupTests {
    @Test func storedAnswersAreFoundOutsideAWriteAndBoundToTheirRequest() async throws {
        let dir = TemporaryDirectory()
        defer { dir.remove() }
        let store = try StoreTests.open(dir)
        defer { store.database.close() }
        var request = Finance_V1_CreateChargeRequest()
        request.idempotencyKey = "k-1"
        let fingerprint = Idempotency.fingerprint(request)
        // Unknown key: nil.
        #expect(
            try await store.read { c in try c.storedAnswer(scope: "s", key: "k-1", fingerprint: fingerprint, as: Finance_V1_CreateChargeResponse.self)
            } == nil)
        let made = try await store.write { tx in
            try tx.idempotent(scope: "s", key: "k-1", fingerprint: fingerprint) {
                var r = Finance_V1_CreateChargeResponse()
                r.transaction.transactionId = "t-1"
                return r
            }
        }
        #expect(!made.replayed)
        let found = try await store.read { c in
            try c.storedAnswer(scope: "s", key: "k-1", fingerprint: fingerprint, as: Finance_V1_CreateChargeResponse.self)
        }
        #expect(found?.transaction.transactionId == "t-1")
        // Another scope: unknown; another request with the key: FAILED_PRECONDITION naming the field.
        #expect(
            try await store.read { c in
                try c.storedAnswer(scope: "other", key: "k-1", fingerprint: fingerprint, as: Finance_V1_CreateChargeResponse.self)
            } == nil)
        var other = request
        other.description_p = "different"
        let otherPrint = Idempotency.fingerprint(other)
        await expectFailure(.failedPrecondition, fields: ["idempotency_key"]) {
            try await store.read { c in try c.storedAnswer(scope: "s", key: "k-1", fingerprint: otherPrint, as: Finance_V1_CreateChargeResponse.self)
            }
        }
    }
}
