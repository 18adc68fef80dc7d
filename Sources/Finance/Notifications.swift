import Contracts
import ServiceKit
import Storage

/// Telling people about money (social owns notifications): one `SocialInternal/SendNotification`
/// per transaction, queued in the outbox in the same transaction as the money, so it is sent if
/// and only if the money was recorded, and retried until social acknowledges it. The event id is
/// the transaction's (`finance:<id>`): social stores it once however often it is delivered.
enum Notifications {
    static func enqueue(_ tx: Transaction, for t: Finance_V1_Transaction, recipients: [String], actor: String) throws {
        var seen = Set<String>()
        let to = recipients.filter { !$0.isEmpty && $0 != actor && seen.insert($0).inserted }
        guard !to.isEmpty else { return }
        var request = Social_V1_SendNotificationRequest()
        request.eventId = "finance:\(t.transactionId)"
        request.recipientUserIds = to
        request.kind = .moneyRecorded
        let total = MoneyRules.format(t.total.amountCents, t.total.currency)
        let (what, body): (String, String)
        switch t.kind {
        case .payment: (what, body) = ("Payment", "\(total) paid to \(to.count == 1 ? "you" : "\(to.count) housemates")")
        case .charge: (what, body) = ("Charge", "\(total) charged to \(to.count == 1 ? "you" : "\(to.count) housemates")")
        case .settlement: (what, body) = ("Task settled", "\(total) owed for the task")
        case .repayment: (what, body) = ("Repayment", "\(total) repaid")
        default: (what, body) = ("Money", total)
        }
        request.title = String(String.UnicodeScalarView("\(what): \(t.description_p)".unicodeScalars.prefix(100)))
        request.body = body
        request.actorUserId = actor
        var target = Social_V1_NotificationTarget()
        target.transactionId = t.transactionId
        request.target = target
        request.data = [
            "transaction_id": t.transactionId, "kind": t.kind.protoName ?? "", "amount_cents": String(t.total.amountCents),
            "currency": t.total.currency,
        ]
        if !t.householdId.isEmpty { request.data["household_id"] = t.householdId }
        if !t.taskId.isEmpty { request.data["task_id"] = t.taskId }
        try tx.enqueueCall(Social_V1_SocialInternalMethods.sendNotification, request, eventID: request.eventId)
    }
}
