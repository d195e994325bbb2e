"""The lowest floor: helpers that model/, data/, training/ and analysis/ may all import; it imports none of them."""
