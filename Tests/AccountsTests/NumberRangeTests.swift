import Contracts
import Foundation
import RPCCore
import Testing

/// Issue 35: every number a client sends accounts (page sizes, enum numbers) is checked for range
/// before it is used, answered INVALID_ARGUMENT naming the field; none reaches an overflow trap
/// (which would end the test process, and in production the service).
@Suite struct NumberRangeTests {
    @Test func pageSizesAtTheInt32ExtremesAreRefusedOrClamped() async throws {
        try await withAccounts { env in
            let me = try await env.signUp().session
            var search = Accounts_V1_SearchUsersRequest()
            for size: Int32 in [-1, .min] {
                search.pageSize = size
                await expectFailure(.invalidArgument, fields: ["page_size"]) { try await env.accounts.searchUsers(search, options: bearer(me)) }
            }
            search.pageSize = .max  // clamped to 100 (the contract)
            #expect(try await env.accounts.searchUsers(search, options: bearer(me)).users.count == 1)

            var list = Accounts_V1_ListSentMailRequest()
            for size: Int32 in [-1, .min] {
                list.pageSize = size
                await expectFailure(.invalidArgument, fields: ["page_size"]) { try await env.internalAPI.listSentMail(list) }
            }
            list.pageSize = .max
            #expect(try await env.internalAPI.listSentMail(list).mails.isEmpty)
        }
    }

    @Test func mailKindsOutsideTheEnumAreNamed() async throws {
        try await withAccounts { env in
            var list = Accounts_V1_ListSentMailRequest()
            for raw: Int32 in [3, -1, .max, .min] {
                list.kind = .unrecognized(raw)
                await expectFailure(.invalidArgument, fields: ["kind"]) { try await env.internalAPI.listSentMail(list) }
            }
            var send = Accounts_V1_SendMailRequest()
            send.eventId = "social:evt-range"
            send.kind = .unrecognized(.max)
            send.toEmail = "someone@example.org"
            send.subject = "Hello"
            send.bodyText = "Hello."
            await expectFailure(.invalidArgument, fields: ["kind"]) { try await env.internalAPI.sendMail(send) }
            // Still serving.
            list.kind = .unspecified
            let mails = try await env.internalAPI.listSentMail(list).mails
            #expect(mails.isEmpty)
        }
    }
}
