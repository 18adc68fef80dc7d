import Contracts
import RPCCore

// Maintained by hand (the generator emits no message registry): every RPC of matchmaking.v1.Matchmaking and
// matchmaking.v1.MatchmakingInternal with its Swift request and response types. ContractTests checks that
// this table lists exactly the methods of Matchmaking_V1_MatchmakingMethods.all and
// Matchmaking_V1_MatchmakingInternalMethods.all and that each type's protoMessageName matches the
// descriptor, so a new RPC fails the tests until its line is added here.
extension ContractCatalog {
    static let matchmaking = ContractCatalog.Service(
        directory: "matchmaking",
        methods: Matchmaking_V1_MatchmakingMethods.all + Matchmaking_V1_MatchmakingInternalMethods.all,
        rpcs: [
            ContractRPC(
                Matchmaking_V1_MatchmakingMethods.createChallenge, Matchmaking_V1_CreateChallengeRequest.self,
                Matchmaking_V1_CreateChallengeResponse.self),
            ContractRPC(
                Matchmaking_V1_MatchmakingMethods.acceptChallenge, Matchmaking_V1_AcceptChallengeRequest.self,
                Matchmaking_V1_AcceptChallengeResponse.self),
            ContractRPC(
                Matchmaking_V1_MatchmakingMethods.rejectChallenge, Matchmaking_V1_RejectChallengeRequest.self,
                Matchmaking_V1_RejectChallengeResponse.self),
            ContractRPC(
                Matchmaking_V1_MatchmakingMethods.cancelChallenge, Matchmaking_V1_CancelChallengeRequest.self,
                Matchmaking_V1_CancelChallengeResponse.self),
            ContractRPC(
                Matchmaking_V1_MatchmakingMethods.listChallenges, Matchmaking_V1_ListChallengesRequest.self,
                Matchmaking_V1_ListChallengesResponse.self),
            ContractRPC(Matchmaking_V1_MatchmakingMethods.joinQueue, Matchmaking_V1_JoinQueueRequest.self, Matchmaking_V1_JoinQueueResponse.self),
            ContractRPC(
                Matchmaking_V1_MatchmakingMethods.cancelQueue, Matchmaking_V1_CancelQueueRequest.self, Matchmaking_V1_CancelQueueResponse.self),
            ContractRPC(
                Matchmaking_V1_MatchmakingMethods.startLocalMatch, Matchmaking_V1_StartLocalMatchRequest.self,
                Matchmaking_V1_StartLocalMatchResponse.self),
            ContractRPC(Matchmaking_V1_MatchmakingMethods.getMatch, Matchmaking_V1_GetMatchRequest.self, Matchmaking_V1_GetMatchResponse.self),
            ContractRPC(
                Matchmaking_V1_MatchmakingMethods.listMyMatches, Matchmaking_V1_ListMyMatchesRequest.self, Matchmaking_V1_ListMyMatchesResponse.self),
            ContractRPC(Matchmaking_V1_MatchmakingMethods.submitMove, Matchmaking_V1_SubmitMoveRequest.self, Matchmaking_V1_SubmitMoveResponse.self),
            ContractRPC(Matchmaking_V1_MatchmakingMethods.watchMatch, Matchmaking_V1_WatchMatchRequest.self, Matchmaking_V1_WatchMatchResponse.self),
            ContractRPC(Matchmaking_V1_MatchmakingMethods.quitMatch, Matchmaking_V1_QuitMatchRequest.self, Matchmaking_V1_QuitMatchResponse.self),
            ContractRPC(
                Matchmaking_V1_MatchmakingMethods.requestRematch, Matchmaking_V1_RequestRematchRequest.self,
                Matchmaking_V1_RequestRematchResponse.self),
            ContractRPC(
                Matchmaking_V1_MatchmakingMethods.declineRematch, Matchmaking_V1_DeclineRematchRequest.self,
                Matchmaking_V1_DeclineRematchResponse.self),
            ContractRPC(
                Matchmaking_V1_MatchmakingMethods.sendChatMessage, Matchmaking_V1_SendChatMessageRequest.self,
                Matchmaking_V1_SendChatMessageResponse.self),
            ContractRPC(
                Matchmaking_V1_MatchmakingMethods.listChatMessages, Matchmaking_V1_ListChatMessagesRequest.self,
                Matchmaking_V1_ListChatMessagesResponse.self),
            ContractRPC(
                Matchmaking_V1_MatchmakingMethods.listMatchMoves, Matchmaking_V1_ListMatchMovesRequest.self,
                Matchmaking_V1_ListMatchMovesResponse.self),
            ContractRPC(
                Matchmaking_V1_MatchmakingMethods.getMatchReplay, Matchmaking_V1_GetMatchReplayRequest.self,
                Matchmaking_V1_GetMatchReplayResponse.self),
            ContractRPC(
                Matchmaking_V1_MatchmakingMethods.getPlayerStats, Matchmaking_V1_GetPlayerStatsRequest.self,
                Matchmaking_V1_GetPlayerStatsResponse.self),
            ContractRPC(Matchmaking_V1_MatchmakingMethods.getRating, Matchmaking_V1_GetRatingRequest.self, Matchmaking_V1_GetRatingResponse.self),
            ContractRPC(
                Matchmaking_V1_MatchmakingMethods.getLeaderboard, Matchmaking_V1_GetLeaderboardRequest.self,
                Matchmaking_V1_GetLeaderboardResponse.self),
            ContractRPC(
                Matchmaking_V1_MatchmakingInternalMethods.eraseUser, Matchmaking_V1_EraseUserRequest.self, Matchmaking_V1_EraseUserResponse.self),
        ])
}
