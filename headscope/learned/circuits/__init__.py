"""Edge-level circuits (question 1): a GQA-native graph of senders and receivers, edge scores (EAP, EAP-IG), and
circuits at every size with MIB's faithfulness curve, CPR and CMD (docs/circuits.md)."""
